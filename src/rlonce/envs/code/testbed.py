"""Running a package's tests in a bubblewrap sandbox and reading per-test outcomes.

Nothing in the workspace may load before or instead of the test runner. Tests run through a
launcher (``rlonce_run.py``, from ``rlonce.envs.code.programs``) that lives in the read-only
testbed, under ``python3 -s -P -B`` with no ``PYTHONPATH``: the workspace is not on ``sys.path``
when the interpreter starts, and the launcher puts the testbed first, the system's paths next
and the package's import root last, then imports pytest, pluggy and every ``_pytest`` module
before any workspace code can load. It snapshots their functions and classes and checks them
(and the registered hooks, and that no trace function is set) at every test report; it replaces
``sys.settrace``, ``sys.setprofile`` and the heap-walking ``gc`` calls with guards. Outcomes
come from its own hooks.

The report travels on the sandbox's stdout pipe, which the launcher keeps as a private fd while
fds 1 and 2 point at /dev/null, as one line tagged with a per-run random nonce. The nonce is a
workspace file the launcher reads and deletes before anything of the workspace loads (not an
argument, not an environment variable). A missing, malformed, duplicated or tampered report is
no report: the grader decides whose failure that is. What this cannot stop: code that the tests
import runs in the same process, so a determined library can still reach the runner's objects
(``rlonce.envs.code.env`` scans what the agent adds for that, one more layer).

The sandbox also hides every copy of the package under test that the visible system
directories hold (``system_copies``), so the original code is not reachable inside.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import secrets
import shlex
import shutil
from importlib import resources
from pathlib import Path

from rlonce.envs.code.packages import PackageError, PackageSpec
from rlonce.sandbox.bwrap import BwrapSandbox, Limits

TESTBED_MOUNT = "/opt/rlonce-testbed"
LAUNCHER_NAME = "rlonce_run.py"
REPORT_TAG = "RLONCE-REPORT"
REPORT_CAP = 16 << 20
"""Bytes of sandbox output kept: room for the report of the largest hidden test file."""
SYSTEM_ROOTS = ("/usr",)
"""System directories every sandbox sees (``rlonce.sandbox.bwrap``), searched for package copies."""


@functools.cache
def launcher_source() -> bytes:
    """The launcher, ``rlonce.envs.code.programs.rlonce_run``: the bytes written into the testbed."""
    return resources.files("rlonce.envs.code.programs").joinpath(LAUNCHER_NAME).read_bytes()


def install_launcher(testbed_dir: Path) -> None:
    """Write the launcher into ``testbed_dir`` unless it is there already, atomically (a
    concurrent sandbox sees the old file or the new one, never half of one)."""
    source = launcher_source()
    target = testbed_dir / LAUNCHER_NAME
    if not target.is_file() or target.read_bytes() != source:
        tmp = testbed_dir / f".{LAUNCHER_NAME}.{secrets.token_hex(4)}"
        tmp.write_bytes(source)
        os.chmod(tmp, 0o644)
        tmp.replace(target)


def make_sandbox(spec: PackageSpec, testbed_dir: Path, *, timeout: float | None = None,
                 for_agent: bool = False) -> BwrapSandbox:
    """A sandbox with the testbed mounted and every system copy of the package hidden.
    ``for_agent`` (the rollout sandbox) adds ``PYTHONPATH`` so the agent can run pytest itself;
    sandboxes that produce verdicts never get it (``sitecustomize`` would load from it)."""
    install_launcher(testbed_dir)
    limits = Limits(cpu_seconds=600, address_space_mb=4096, processes=128, file_size_mb=64,
                    wall_seconds=timeout or spec.test_timeout, output_bytes=65536)
    if system_copies(spec, (str(testbed_dir),)):
        raise PackageError(f"the testbed {testbed_dir} holds a copy of {spec.name}: it must hold the test runner only")
    hide = sorted({*spec.hide, *system_copies(spec, SYSTEM_ROOTS)})
    env = {"PYTHONHASHSEED": "0"}
    if for_agent:
        env |= {"PYTHONPATH": f"{TESTBED_MOUNT}:{import_root(spec)}", "PYTHONDONTWRITEBYTECODE": "1"}
    return BwrapSandbox(limits, ro_binds={str(testbed_dir): TESTBED_MOUNT}, hide=hide, env=env)


def import_root(spec: PackageSpec) -> str:
    return "/work" if spec.import_root in ("", ".") else f"/work/{spec.import_root}"


def package_dirs(spec: PackageSpec) -> list[str]:
    """The package's own source trees (relative to the sdist root): where the agent's change may
    be carried from. A single-module package is its module file."""
    root = Path(spec.import_root) if spec.import_root not in ("", ".") else Path()
    depth = len(root.parts)
    return sorted({Path(*Path(m).parts[:depth + 1]).as_posix() for m in spec.modules})


def top_level_names(spec: PackageSpec) -> list[str]:
    return sorted({Path(p).name.removesuffix(".py") for p in package_dirs(spec)})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.lru_cache(maxsize=64)
def system_copies(spec: PackageSpec, roots: tuple[str, ...]) -> tuple[str, ...]:
    """Every path under ``roots`` that holds a copy of the package: a directory named like a
    top-level package holding ``__init__.py``, a ``<module>.py``, a cached ``<module>.*.pyc``,
    an installed ``*.dist-info``/``*.egg-info`` of the distribution, or an archive of it
    (``.tar.gz``, ``.zip``, ``.whl``). Mount points are crossed (``find -xdev`` misses e.g. a
    separately mounted ``/usr``); links are not followed. Searched once per process."""
    names = {_norm(n) for n in top_level_names(spec)}
    dist = _norm(spec.name)
    found = []
    for root in roots:
        stack = [root]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            for e in entries:
                n = e.name
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                low = _norm(n)
                hit = False
                if is_dir:
                    hit = (low in names and os.path.isfile(os.path.join(e.path, "__init__.py"))) or (
                        (low.endswith("_dist_info") or low.endswith("_egg_info")) and low.startswith(dist + "_"))
                    if not hit:
                        stack.append(e.path)
                else:
                    stem = n.split(".")[0].lower()
                    hit = (n.endswith(".py") and _norm(n[:-3]) in names) or (
                        n.endswith(".pyc") and _norm(stem) in names) or (
                        n.endswith((".tar.gz", ".zip", ".whl", ".tgz", ".tar.bz2")) and low.startswith(dist + "_"))
                if hit:
                    found.append(e.path)
    return tuple(sorted(found))


def nonce_file(i: int) -> str:
    return f".rlonce-nonce-{i}"


GUARDS = ("sys.settrace", "sys.setprofile", "sys._current_frames", "threading.settrace", "threading.setprofile",
          "threading.settrace_all_threads", "threading.setprofile_all_threads", "gc.get_objects", "gc.get_referrers",
          "gc.get_referents")
"""Calls the launcher refuses (and reports as tampering) unless the package's own sources make them."""


@functools.lru_cache(maxsize=64)
def guards_for(tree: Path, spec: PackageSpec) -> tuple[str, ...]:
    """``GUARDS`` minus the calls the pristine package ``tree`` itself names (boltons' gcutils
    walks the heap; its own tests must still run)."""
    text = "".join((tree / p).read_text(errors="replace") if (tree / p).is_file() else
                   "".join(f.read_text(errors="replace") for f in sorted((tree / p).rglob("*.py")))
                   for p in package_dirs(spec))
    return tuple(g for g in GUARDS if g.rsplit(".", 1)[1] not in text)


def launcher_command(spec: PackageSpec, targets: list[str], nonce_path: str, guards: tuple[str, ...] = GUARDS) -> str:
    args = ["/usr/bin/python3", "-s", "-P", "-B", f"{TESTBED_MOUNT}/{LAUNCHER_NAME}", nonce_path, import_root(spec),
            ",".join(guards), "-q", "-p", "no:cacheprovider", "--tb=line", *spec.pytest_args, "--", *targets]
    return " ".join(shlex.quote(a) for a in args)


def parse_report(output: str, nonce: str) -> dict | None:
    """The launcher's report for ``nonce`` in ``output``: ``{"tests": {...}, "tampered": ...}``;
    None when it is missing, malformed or present more than once."""
    tag = f"{REPORT_TAG} {nonce} "
    lines = [ln for ln in output.splitlines() if tag in ln]
    if len(lines) != 1:
        return None
    try:
        rep = json.loads(lines[0].split(tag, 1)[1])
    except ValueError:
        return None
    if not isinstance(rep, dict) or not isinstance(rep.get("tests"), dict):
        return None
    if not all(isinstance(v, dict) and isinstance(v.get("outcome"), str) for v in rep["tests"].values()):
        return None
    return rep


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a package tree into a workspace, leaving out caches and build products."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info", "*.pyc", ".rlonce-ok", "build",
                                    "dist", ".git", ".tox", ".mypy_cache", "*.log")
    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


async def run_reports(sandbox: BwrapSandbox, spec: PackageSpec, targets: list[str], *, reruns: int = 1,
                      timeout: float | None = None, guards: tuple[str, ...] = GUARDS) -> list[dict | None]:
    """Run ``targets`` ``reruns`` times in one sandbox call; per rerun its report (see
    ``parse_report``, plus ``seconds``: the mean wall time of a run) or None. Every rerun's nonce
    is in the workspace from the start, so ``reruns`` > 1 is for trees without agent code
    (building, validation)."""
    sandbox.limits = dataclasses.replace(sandbox.limits, output_bytes=max(sandbox.limits.output_bytes, REPORT_CAP))
    nonces = [secrets.token_hex(16) for _ in range(reruns)]
    for i, n in enumerate(nonces):
        sandbox.put_file(nonce_file(i), n)
    cmds = [launcher_command(spec, targets, f"/work/{nonce_file(i)}", guards) for i in range(reruns)]
    res = await sandbox.exec("; ".join(cmds) + "; true", timeout=(timeout or spec.test_timeout) * reruns)
    reports = [parse_report(res.output, n) for n in nonces]
    for r in reports:
        if r is not None:  # the mean wall time of one run, for sizing and checking timeouts
            r["seconds"] = res.seconds / reruns
    return [None if res.timed_out else r for r in reports]


async def run_tests(sandbox: BwrapSandbox, spec: PackageSpec, targets: list[str], *, reruns: int = 1,
                    timeout: float | None = None, guards: tuple[str, ...] = GUARDS) -> list[dict[str, dict]] | None:
    """Run ``targets`` ``reruns`` times in one sandbox call; per rerun, node id → outcome.
    None when a run produced no usable report (the testbed failed: timeout, crash, no
    interpreter) or saw tampering."""
    reports = await run_reports(sandbox, spec, targets, reruns=reruns, timeout=timeout, guards=guards)
    if any(r is None or r.get("tampered") for r in reports):
        return None
    return [r["tests"] for r in reports]
