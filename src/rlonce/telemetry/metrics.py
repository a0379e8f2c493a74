"""Run-directory writers: one JSON object per line, appended and flushed as each step ends.

A crash or a full disk can leave the last line of a file half written. Readers drop such a
torn last line with a warning on stderr (and a resumed run rewrites the file without it); a
bad line anywhere else means the file was edited or damaged, and is an error naming the line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlonce.errors import RlonceError


class RunFileError(RlonceError, ValueError):
    """A run-directory file is damaged beyond a torn last line; the message names it."""


def _parse(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise RunFileError(f"cannot read {path}: {e.strerror or e}") from None
    numbered = [(n, ln) for n, ln in enumerate(lines, 1) if ln.strip()]
    records = []
    for i, (n, ln) in enumerate(numbered):
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError):
            if i == len(numbered) - 1:
                print(f"rlonce: warning: dropped the torn last line {n} of {path} ({len(ln)} characters)",
                      file=sys.stderr)
                break
            raise RunFileError(f"{path} line {n} is not a JSON object; remove that line (or the run directory "
                               "to start over)") from None
        records.append(rec)
    return records


class JsonlWriter:
    def __init__(self, path: Path, *, keep_until_step: int | None = None, keep_lines: int | None = None):
        """Open ``path`` for appending; on resume, keep its first ``keep_lines`` records (what the
        checkpoint resumed from had written), or without that count those up to ``keep_until_step``;
        a torn last line is dropped either way."""
        self.path = path
        self.lines = 0
        """Records in the file: what a checkpoint notes, to resume with exactly these."""
        if (keep_until_step is not None or keep_lines is not None) and path.exists():
            kept = _parse(path)
            kept = kept[:keep_lines] if keep_lines is not None else [r for r in kept
                                                                      if r.get("step", 0) <= keep_until_step]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
            tmp.replace(path)
            self.lines = len(kept)
        elif path.exists():
            self.lines = len(_parse(path))
        self._f = path.open("a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()
        self.lines += 1

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return _parse(path)


def infra_causes(seqs) -> dict[str, tuple[int, str]]:
    """Per failure category among ``seqs``' infrastructure failures: how many, and the first
    one's cause (what a run's log prints once per category per step)."""
    out: dict[str, tuple[int, str]] = {}
    for s in seqs:
        if s.failure is not None:
            n, cause = out.get(s.failure.value, (0, s.cause or "no cause recorded"))
            out[s.failure.value] = (n + 1, cause)
    return out

