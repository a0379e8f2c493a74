"""Run-directory writers: one JSON object per line, appended and flushed as each step ends."""

from __future__ import annotations

import json
from pathlib import Path


class JsonlWriter:
    def __init__(self, path: Path, *, keep_until_step: int | None = None):
        """Open ``path`` for appending; on resume, drop lines past ``keep_until_step``."""
        self.path = path
        if keep_until_step is not None and path.exists():
            kept = [ln for ln in path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= keep_until_step]
            path.write_text("".join(ln + "\n" for ln in kept))
        self._f = path.open("a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
