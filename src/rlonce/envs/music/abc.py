"""ABC notation in, MIDI out: the extraction rule, the conversion, and the gates (seed 001, "Music
has a compiler, not a listening panel").

Extraction follows the public scorer: the first fenced block that holds an ``X:`` header, else
the text from the **last** ``X:`` header of the reply. Conversion runs ``abc2midi`` (Debian
package ``abcmidi``) in a fresh bubblewrap sandbox with the seed's sixty-second limit: the ABC
text is the policy's, and abc2midi is C code parsing it. abc2midi exits 0 after many errors,
so its log is read, not its exit status.

Gates reject a tune before any feature is measured (reward 0, the gate named in the transcript):
  * ``no_abc``: no ``X:`` header; ``too_long``: more than ``MAX_ABC_CHARS`` characters;
  * ``multiple_tunes``: the extracted text holds a second ``X:`` (a block cannot smuggle a
    different tune after the one it shows);
  * ``blank_line``: a blank line inside the body followed by more music (ABC ends a tune at a
    blank line, so what follows would be silently dropped);
  * ``program_conflict``: two different ``%%MIDI program`` settings for one voice;
  * ``compile_error``: abc2midi reported an error or wrote no MIDI file;
  * ``bar_warnings``: more bars of the wrong length than ``max(2, 10 % of the bars)``;
  * ``no_notes`` / ``too_long_midi``: fewer than ``MIN_NOTES`` notes, more than ``MAX_SECONDS``.

A missing abc2midi is ``Abc2MidiMissing``: infrastructure, never a low score (seed 001: "A
missing executable raises a specific infrastructure error").
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from rlonce.envs.base import GradingError
from rlonce.errors import RlonceError
from rlonce.sandbox.bwrap import BwrapSandbox, Limits

MAX_ABC_CHARS = 16_000
MIN_NOTES = 8
MAX_SECONDS = 900.0
MAX_MIDI_BYTES = 1 << 20
CONVERT_SECONDS = 60.0
"""The public scorer's subprocess timeout for abc2midi."""

FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)
HEADER = re.compile(r"^[ \t]*X:", re.M)
ERROR_LINE = re.compile(r"^Error\b", re.M)
BAR_WARNING = re.compile(r"^Warning.*Bar \d+ has .* time units", re.M)
PROGRAM = re.compile(r"^%%MIDI\s+program\s+(?:(\d+)\s+)?(\d+)", re.M)
VOICE = re.compile(r"^V:\s*(\S+)", re.M)


class Abc2MidiMissing(GradingError, RlonceError):
    """abc2midi is not installed: the score cannot be computed (infrastructure)."""


def extract(reply: str) -> str | None:
    """The ABC the scorer grades: the first fenced block holding an ``X:`` header (from that
    header on), else the reply from its last ``X:`` header; None when there is no header."""
    for block in FENCE.findall(reply):
        m = HEADER.search(block)
        if m:
            return block[m.start():].strip("\n") + "\n"
    heads = list(HEADER.finditer(reply))
    if not heads:
        return None
    return reply[heads[-1].start():].split("```")[0].strip("\n") + "\n"


def _blank_line_inside(abc: str) -> bool:
    lines = abc.splitlines()
    for i, line in enumerate(lines):
        if not line.strip() and any(ln.strip() and not ln.lstrip().startswith("%") for ln in lines[i + 1:]):
            return True
    return False


def _program_conflict(abc: str) -> bool:
    """Two different ``%%MIDI program`` values for one voice (or one channel, when given)."""
    seen: dict[str, str] = {}
    voice = "1"
    for line in abc.splitlines():
        v = VOICE.match(line)
        if v:
            voice = v.group(1)
        p = PROGRAM.match(line)
        if p:
            key = f"ch{p.group(1)}" if p.group(1) else f"v{voice}"
            if seen.setdefault(key, p.group(2)) != p.group(2):
                return True
    return False


def static_gate(abc: str | None) -> str | None:
    """The gate a tune fails before conversion, or None."""
    if abc is None:
        return "no_abc"
    if len(abc) > MAX_ABC_CHARS:
        return "too_long"
    if len(HEADER.findall(abc)) > 1:
        return "multiple_tunes"
    if _blank_line_inside(abc.strip("\n")):
        return "blank_line"
    if _program_conflict(abc):
        return "program_conflict"
    return None


@dataclass
class Conversion:
    midi: bytes | None
    log: str
    errors: int = 0
    bar_warnings: int = 0
    timed_out: bool = False

    def gate(self, bars: int) -> str | None:
        if self.midi is None or self.errors or self.timed_out:
            return "compile_error"
        if self.bar_warnings > max(2, bars // 10):
            return "bar_warnings"
        return None


def require_abc2midi() -> str:
    path = shutil.which("abc2midi")
    if path is None:
        raise Abc2MidiMissing("abc2midi is not installed; install the Debian package: apt-get install abcmidi")
    return path


async def convert(abc: str, timeout: float = CONVERT_SECONDS) -> Conversion:
    """Run abc2midi on ``abc`` in a fresh sandbox; the MIDI bytes (None when none was written)
    and what its log says. Raises ``Abc2MidiMissing`` when abc2midi is not installed."""
    require_abc2midi()
    box = BwrapSandbox(Limits(cpu_seconds=int(timeout), wall_seconds=timeout, file_size_mb=4, output_bytes=65536))
    try:
        box.put_file("tune.abc", abc)
        r = await box.exec("abc2midi tune.abc -o tune.mid", timeout=timeout)
        try:
            midi = box.get_file("tune.mid", max_bytes=MAX_MIDI_BYTES)
        except Exception:  # noqa: BLE001 - no file (or not a readable one): nothing was converted
            midi = None
    finally:
        box.close()
    return Conversion(midi or None, r.output, len(ERROR_LINE.findall(r.output)),
                      len(BAR_WARNING.findall(r.output)), r.timed_out)
