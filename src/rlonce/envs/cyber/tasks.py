"""Vulnerability-reproduction tasks: one per planted bug of a target, as a pack on disk.

A pack (``rlonce tasks build cyber --out DIR``) holds each target's source and manifest under
``targets/<name>/``, its sanitizer build under ``bin/<name>``, ``pack.json`` (compiler, flags,
source hashes) and ``tasks.json``. A task names its target and the bug's vulnerability type,
function and file — taken from the sanitizer report of the bug's reference PoC when the pack was
built (seed 001: "The description and verification target come from the same report"). The
reference PoC stays in the manifest, which never enters the agent's sandbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlonce.errors import PackError


@dataclass(frozen=True)
class CyberTask:
    task_id: str
    source: str
    target: str
    bug_id: str
    kind: str
    """The vulnerability type the oracle must see (``rlonce.envs.cyber.sanitizer`` names)."""
    function: str
    """The topmost project frame the oracle must see."""
    file: str
    sanitizer: str
    pack_dir: str
    split: str = "train"

    @property
    def binary(self) -> Path:
        return Path(self.pack_dir) / "bin" / self.target

    @property
    def source_file(self) -> Path:
        return Path(self.pack_dir) / "targets" / self.target / f"{self.target}.c"

    @property
    def description(self) -> str:
        san = "AddressSanitizer" if self.sanitizer == "address" else "UndefinedBehaviorSanitizer"
        return (f"`{self.target}` (src/{self.file}) reads one input file. {san} reports `{self.kind}` in "
                f"`{self.function}` ({self.file}). Write an input that triggers exactly this bug and submit its path.")

    def reference_poc(self) -> bytes:
        return bytes.fromhex(bug_manifest(Path(self.pack_dir), self.target)[self.bug_id]["poc_hex"])


def bug_manifest(pack: Path, target: str) -> dict[str, dict]:
    bugs = json.loads((Path(pack) / "targets" / target / "bugs.json").read_text())
    return {b["id"]: b for b in bugs}


def load_pack(pack: Path) -> list[CyberTask]:
    pack = Path(pack)
    meta = pack / "pack.json"
    if not meta.is_file() or json.loads(meta.read_text()).get("domain") != "cyber":
        raise PackError(f"{pack} is not a cyber pack (no pack.json of domain 'cyber'); build one with "
                        "`rlonce tasks build cyber --out DIR`")
    return [CyberTask(**t, pack_dir=str(pack.resolve())) for t in json.loads((pack / "tasks.json").read_text())]
