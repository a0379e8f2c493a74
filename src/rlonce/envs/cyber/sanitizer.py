"""Sanitizer reports → (vulnerability type, stack): the oracle's reading of ASan and UBSan output.

Seed 001: "The reported oracle matches vulnerability type and the topmost project-level stack
frame from a sanitizer report." The type is the report's own word for the error, normalised to
the names below; the topmost project frame is the first frame of the first stack whose source
file is one of the target's files (frames in the sanitizer runtime, such as ``__asan_memcpy``,
and in libc are skipped).

AddressSanitizer: ``ERROR: AddressSanitizer: <type>`` (``heap-buffer-overflow``,
``stack-buffer-overflow``, ``global-buffer-overflow``, ``heap-use-after-free``, ``SEGV``,
``stack-overflow``, ``double-free`` from "attempting double-free", ``bad-free`` from "attempting
free on address which was not malloc()-ed", ``out-of-memory``, ``allocation-size-too-big``, a
deadly signal such as ``ABRT`` …; "hard rss limit exhausted", which has no ``ERROR:``, is
``out-of-memory``). UndefinedBehaviorSanitizer: ``file:line:col: runtime error:
<message>``, named by ``UBSAN_KINDS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

ASAN = re.compile(r"(?:ERROR: )?AddressSanitizer: (attempting double-free|attempting free on address which was not "
                  r"malloc\(\)-ed|requested allocation size|hard rss limit exhausted|out of memory|"
                  r"allocator is out of memory|[A-Za-z][\w-]*)")
ASAN_NAMES = {"attempting double-free": "double-free",
              "attempting free on address which was not malloc()-ed": "bad-free",
              "requested allocation size": "allocation-size-too-big", "hard rss limit exhausted": "out-of-memory",
              "out of memory": "out-of-memory", "allocator is out of memory": "out-of-memory"}
DEADLY = re.compile(r"(?:ERROR: )?AddressSanitizer: (?:DEADLYSIGNAL|(\w+) on unknown address)")
UBSAN = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?P<col>\d+): runtime error: (?P<msg>.*)$", re.M)
UBSAN_KINDS = (
    ("signed integer overflow", "signed-integer-overflow"),
    ("division by zero", "division-by-zero"),
    ("shift exponent", "shift-exponent"),
    ("left shift of", "shift-base"),
    ("out of bounds for type", "out-of-bounds-index"),
    ("null pointer", "null-pointer-use"),
    ("misaligned address", "misaligned"),
    ("is outside the range of representable values", "float-cast-overflow"),
    ("not a valid value for type", "invalid-value"),
    ("unsigned integer overflow", "unsigned-integer-overflow"),
)
FRAME = re.compile(r"^\s*#(?P<n>\d+) 0x[0-9a-f]+ in (?P<func>\S+)(?: (?P<loc>\S+))?", re.M)


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    """The source file's base name ('' when the frame has no source location)."""
    line: int = 0


@dataclass(frozen=True)
class Report:
    sanitizer: str
    """'address' or 'undefined'."""
    kind: str
    frames: tuple[Frame, ...]
    message: str

    def top_frame(self, sources: set[str]) -> Frame | None:
        """The topmost frame in one of the project's ``sources`` (base names)."""
        return next((f for f in self.frames if f.file in sources), None)


def _frames(text: str) -> tuple[Frame, ...]:
    """The first stack trace in ``text``: frames from #0 until the trace ends."""
    out: list[Frame] = []
    for m in FRAME.finditer(text):
        if int(m.group("n")) == 0 and out:
            break
        loc = m.group("loc") or ""
        path, line = (loc.split(":") + ["0"])[:2] if not loc.startswith("(") else ("", "0")
        out.append(Frame(m.group("func"), PurePosixPath(path).name, int(line) if line.isdigit() else 0))
    return tuple(out)


def _ubsan_kind(message: str) -> str:
    return next((kind for key, kind in UBSAN_KINDS if key in message), "ubsan-other")


def parse(text: str) -> Report | None:
    """The first sanitizer report in ``text``, or None when there is none."""
    a, u = ASAN.search(text), UBSAN.search(text)
    if a is None and u is None:
        return None
    if u is not None and (a is None or u.start() < a.start()):
        msg = u.group("msg").strip()
        frames = _frames(text[u.end():])
        head = Frame("", PurePosixPath(u.group("file")).name, int(u.group("line")))
        if not frames or frames[0].file != head.file:
            frames = (head, *frames)
        return Report("undefined", _ubsan_kind(msg), frames, msg[:300])
    word = a.group(1)
    kind = ASAN_NAMES.get(word, word)
    deadly = DEADLY.search(text, a.start())
    if deadly and deadly.start() == a.start() and deadly.group(1):
        kind = deadly.group(1)
    line_end = text.find("\n", a.start())
    return Report("address", kind, _frames(text[a.start():]), text[a.start():line_end if line_end > 0 else None][:300])
