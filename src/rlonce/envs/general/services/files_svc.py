"""Files: the user's documents, real files under the service's folder; ``shared/`` is read-only.

Paths are relative, of ``[A-Za-z0-9_.-]`` segments, at most three deep, with an extension of
``EXTENSIONS``; a ``.json`` document must parse and a ``.csv`` one must have rows of equal width.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from svc_common import fail, serve, text

EXTENSIONS = (".md", ".txt", ".csv", ".json")
SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MAX_FILES = 200


class Files:
    def __init__(self, state: Path, me: str, today: str):
        self.me, self.today = me, today
        self.root = state / "files"
        self.root.mkdir(exist_ok=True)

    def where(self, path: str, *, must_exist: bool = True) -> Path:
        parts = path.split("/")
        if not 1 <= len(parts) <= 3 or not all(SEGMENT.match(p) for p in parts) or not path.endswith(EXTENSIONS):
            raise fail("bad_arguments", f"{path!r} is not a document path (folder/name{'|'.join(EXTENSIONS)})")
        p = self.root.joinpath(*parts)
        if must_exist and not p.is_file():
            raise fail("not_found", f"no document {path}")
        return p

    def writable(self, path: str) -> None:
        if path.startswith("shared/"):
            raise fail("permission_denied", f"{path} is in the read-only folder shared/")

    def well_formed(self, path: str, content: str) -> None:
        if path.endswith(".json"):
            try:
                json.loads(content)
            except ValueError as e:
                raise fail("bad_arguments", f"{path} is not valid JSON: {e}") from None
        if path.endswith(".csv"):
            widths = {len(r) for r in csv.reader(io.StringIO(content)) if r}
            if len(widths) > 1:
                raise fail("bad_arguments", f"{path}: rows have different numbers of fields {sorted(widths)}")

    def list_files(self, folder: str = "") -> dict:
        """Documents under ``folder`` ('' for all), with their sizes."""
        base = self.root / folder if folder else self.root
        if folder and (not all(SEGMENT.match(p) for p in folder.split("/")) or not base.is_dir()):
            raise fail("not_found", f"no folder {folder}")
        out = [
            {"path": p.relative_to(self.root).as_posix(), "bytes": p.stat().st_size}
            for p in sorted(base.rglob("*"))
            if p.is_file()
        ]
        return {"files": out[:MAX_FILES]}

    def read_file(self, path: str) -> dict:
        """A document's text."""
        return {"path": path, "content": self.where(path).read_text()}

    def write_file(self, path: str, content: str, overwrite: bool = False) -> dict:
        """Create a document (``overwrite``: replace an existing one)."""
        p = self.where(path, must_exist=False)
        self.writable(path)
        if p.exists() and not overwrite:
            raise fail("conflict", f"{path} exists; pass overwrite=true to replace it")
        self.well_formed(path, text(content, "content", required=False))
        if len(list(self.root.rglob("*"))) >= MAX_FILES:
            raise fail("permission_denied", f"the document store is full ({MAX_FILES} entries)")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return {"path": path, "bytes": len(content.encode())}

    def delete_file(self, path: str) -> dict:
        """Delete a document."""
        p = self.where(path)
        self.writable(path)
        p.unlink()
        return {"path": path, "deleted": True}


TOOLS = ("list_files", "read_file", "write_file", "delete_file")


def build(state: Path, me: str, today: str):
    svc = Files(state, me, today)
    me, today = svc.me, svc.today
    return serve(
        svc, TOOLS, "files", instructions=f"Documents of {me}: paths like 'reports/q3.md'; 'shared/' is read-only."
    )
