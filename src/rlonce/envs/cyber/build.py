"""``rlonce tasks build cyber``: compile the targets with the sanitizers and write a task pack.

The targets ship with rlonce (``rlonce/envs/cyber/targets/``: original C programs written for
the project, each with planted bugs and a manifest of reference PoCs). Each is built once with
clang, AddressSanitizer and UndefinedBehaviorSanitizer (``FLAGS``: no optimisation, debug
information and frame pointers, so the report's frames are the source's functions). Then every
bug's reference PoC runs through the oracle: the task's description and target (type, function,
file) are what that report says. A bug whose report disagrees with its manifest is left out and
named in ``build.json`` (the manifest is wrong, or the compiler changed the program).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.envs.cyber.generate import write_targets
from rlonce.envs.cyber.oracle import run_input
from rlonce.errors import PackError, RlonceError

TARGETS = Path(__file__).with_name("targets")
FLAGS = ["-std=c11", "-g", "-O0", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined"]


class ClangMissing(RlonceError):
    pass


def require_clang() -> str:
    path = shutil.which("clang")
    if path is None:
        raise ClangMissing("clang is not installed; install the Debian package: apt-get install clang")
    return path


def target_names() -> list[str]:
    return sorted(p.name for p in TARGETS.iterdir() if (p / "bugs.json").is_file())


def compile_target(src: Path, out: Path) -> None:
    r = subprocess.run([require_clang(), *FLAGS, "-o", str(out), str(src)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise PackError(f"clang could not build {src.name}: {r.stderr.strip()[-400:]}")


async def _describe(pack: Path, name: str, bug: dict) -> tuple[dict | None, str]:
    run = await run_input(pack / "bin" / name, bytes.fromhex(bug["poc_hex"]))
    rep = run.report
    top = rep.top_frame({f"{name}.c"}) if rep else None
    if rep is None or top is None:
        return None, "the reference PoC produced no sanitizer report in the target's source"
    if (rep.kind, top.function) != (bug["type"], bug["function"]):
        return None, f"the reference PoC reports {rep.kind} in {top.function}, the manifest says " \
                     f"{bug['type']} in {bug['function']}"
    return {"task_id": f"cyber/{bug['id']}", "source": "cyber", "target": name, "bug_id": bug["id"],
            "kind": rep.kind, "function": top.function, "file": top.file, "sanitizer": rep.sanitizer}, ""


def build_pack(out: Path, names: list[str] | None = None, *, generated: int = 0, seed: int = 0,
               handlers: int = 8, progress: bool = True) -> list[dict]:
    """Build ``names`` (default: every shipped target; ``[]``: none) and ``generated`` targets of
    ``seed`` with ``handlers`` handlers (and bugs) each (``generate.write_targets``) into the pack
    ``out``; the tasks written."""
    clang = require_clang()
    out = Path(out)
    names = list(target_names() if names is None else names)
    (out / "bin").mkdir(parents=True, exist_ok=True)
    for name in names:
        dest = out / "targets" / name
        dest.mkdir(parents=True, exist_ok=True)
        for f in (f"{name}.c", "bugs.json"):
            shutil.copyfile(TARGETS / name / f, dest / f)
    names += write_targets(out / "targets", generated, seed, handlers)
    if not names:
        raise PackError("no targets to build: name shipped targets or ask for generated ones")
    hashes = {}
    for name in tqdm(names, desc="compiling targets", unit="target", disable=not progress, leave=False):
        dest = out / "targets" / name
        compile_target(dest / f"{name}.c", out / "bin" / name)
        hashes[name] = hashlib.sha256((dest / f"{name}.c").read_bytes()).hexdigest()
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    (out / "pack.json").write_text(json.dumps({"domain": "cyber", "clang": version, "flags": FLAGS,
                                               "targets": hashes, "generated": {"count": generated, "seed": seed,
                                                             "handlers": handlers}},
                                              indent=2) + "\n")
    jobs = [(name, bug) for name in names for bug in json.loads((out / "targets" / name / "bugs.json").read_text())]

    async def all_() -> list[tuple[dict | None, str]]:
        sem = asyncio.Semaphore(2)

        async def one(name, bug):
            async with sem:
                return await _describe(out, name, bug)

        return await asyncio.gather(*(one(n, b) for n, b in jobs))

    results = asyncio.run(all_())
    tasks = [t for t, _ in results if t is not None]
    dropped = {f"cyber/{b['id']}": why for (_, b), (t, why) in zip(jobs, results) if t is None}
    (out / "tasks.json").write_text(json.dumps(tasks, indent=1) + "\n")
    (out / "build.json").write_text(json.dumps({"tasks": len(tasks), "dropped": dropped}, indent=2) + "\n")
    return tasks


def build_command(out: Path, settings, *, progress: bool = True) -> str:
    """``rlonce tasks build cyber`` (``PackTools.build``): the shipped targets ``settings.targets``
    names (default: all; 'none': none; the settings have checked the names) and ``settings.generated``
    generated ones."""
    require_clang()
    names = [] if settings.targets == "none" else settings.targets.split(",") if settings.targets else target_names()
    tasks = build_pack(out, names, generated=settings.generated, seed=settings.seed, handlers=settings.handlers,
                       progress=progress)
    return f"wrote {len(tasks)} tasks from {len(names) + settings.generated} targets to {out}"
