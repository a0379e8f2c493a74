"""Code-repair tasks: data (picklable), the pack on disk, and the rollout workspace.

A pack directory holds ``pack.json`` (its domain, seed, packages with their pins, task count),
``tasks.jsonl`` (one ``CodeTask`` per line) and ``cache/`` (the pinned sdists and their
unpacked trees). A task is a mutation of one package file plus what grading needs: the
fail-to-pass (F2P) and pass-to-pass (P2P) test ids, the hidden test files (the *test patch*:
every test file that carries an F2P test, removed from the rollout workspace), and the
problem statement, written from the observed failure without the fix.

The rollout workspace is a git repository whose only history is one commit of the buggy
state: no other refs, no reflog, no remotes, no stash, no packs, no caches or build products,
no hidden test file, and neither the reference fix nor the unmutated package anywhere in it.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from rlonce.envs.base import Checkout
from rlonce.envs.code.mutate import Mutation
from rlonce.envs.code.packages import PACKAGES, PackageError, PackageSpec, fetch, testbed
from rlonce.errors import PackError
from rlonce.sandbox.base import SandboxError

PACK_FORMAT = 1
GRADER_NOTE = "inside the task's buggy repository, where `python3 -m pytest` runs its tests"
GRADER_CHECK = "cd /work && python3 -m pytest -q -x 2>&1 | tail -3"
"""What a scripted agentic grader runs in the repository: its visible tests."""
GIT_ID = ["-c", "user.name=rlonce", "-c", "user.email=rlonce@localhost", "-c", "init.defaultBranch=main",
          "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*"]


@dataclass
class CodeTask:
    task_id: str
    package: str
    version: str
    mutation: dict
    problem: str
    f2p: list[str]
    p2p: list[str]
    hidden_files: dict[str, str]
    """Path → original content of every test file carrying an F2P test (the test patch)."""
    timeout: float = 60.0
    pack_dir: str = ""
    split: str = "train"
    extra: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return "code"

    @property
    def spec(self) -> PackageSpec:
        spec = PACKAGES.get(self.package)
        if spec is None:
            local = self.extra.get("local_spec")
            if local is None:
                raise PackError(f"task {self.task_id}: unknown package {self.package!r}")
            spec = PackageSpec(**{**local, "modules": tuple(local["modules"]), "tests": tuple(local["tests"]),
                                  "pytest_args": tuple(local.get("pytest_args", ())),
                                  "hide": tuple(local.get("hide", ()))})
        return spec

    @property
    def mut(self) -> Mutation:
        return Mutation(**self.mutation)

    def tree(self) -> Path:
        return fetch(self.spec, Path(self.pack_dir) / "cache")

    def fix_diff(self) -> str:
        """The reference fix as a unified diff (buggy → original); for validation and probes only."""
        m = self.mut
        original = (self.tree() / m.path).read_bytes()
        buggy = m.apply(original)
        return "".join(difflib.unified_diff(buggy.decode().splitlines(True), original.decode().splitlines(True),
                                            f"a/{m.path}", f"b/{m.path}"))

    def checkout(self) -> Checkout | None:
        """The buggy repository with the code testbed mounted, so its tests run, for an agentic
        grader (``rlonce.envs.base.HasCheckout``); None for a task not read from a pack."""
        if not self.pack_dir:
            return None
        return Checkout(partial(grader_sandbox, self), GRADER_NOTE, GRADER_CHECK)

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("pack_dir")
        return json.dumps(d)


def write_pack(out: Path, tasks: list[CodeTask], *, seed: int, packages: list[PackageSpec],
               tier: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"domain": "code", "format": PACK_FORMAT, "seed": seed, "tasks": len(tasks), "tier": tier or {},
                "packages": {p.name: {"version": p.version, "sha256": p.sha256} for p in packages}}
    (out / "pack.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "tasks.jsonl").write_text("".join(t.to_json() + "\n" for t in tasks))


def load_pack(pack: Path) -> list[CodeTask]:
    pack = Path(pack)
    if not (pack / "pack.json").is_file() or not (pack / "tasks.jsonl").is_file():
        raise PackError(f"{pack} is not a task pack (expected pack.json and tasks.jsonl); "
                        "build one with `rlonce tasks build code --out DIR`")
    path = pack / "tasks.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PackError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}; rebuild the pack with "
                        "`rlonce tasks build code --out DIR`") from None
    tasks = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            tasks.append(CodeTask(**record, pack_dir=str(pack.resolve())))
        except (ValueError, TypeError, RecursionError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PackError(f"{path} line {n} is not a task ({reason[:120]}); rebuild the pack with "
                            "`rlonce tasks build code --out DIR`") from None
    return tasks


def _git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {r.stderr.strip()}")
    return r.stdout.strip()


def materialize(task: CodeTask, dest: Path, *, fixed: bool = False, hidden: bool = False,
                git: bool = True) -> str | None:
    """Write the task's workspace into ``dest``: the buggy tree (or, with ``fixed``, the
    original), without the hidden test files unless ``hidden``. With ``git`` the tree becomes a
    one-commit repository, cleaned of everything but that commit; returns its hash."""
    from rlonce.envs.code.testbed import copy_tree

    dest.mkdir(parents=True, exist_ok=True)
    copy_tree(task.tree(), dest)
    m = task.mut
    if not fixed:
        target = dest / m.path
        target.write_bytes(m.apply(target.read_bytes()))
    for path in task.hidden_files:
        if not hidden:
            (dest / path).unlink(missing_ok=True)
    if not git:
        return None
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "--no-verify", "-m", "base")
    for junk in ("logs", "hooks", "COMMIT_EDITMSG", "description", "info", "FETCH_HEAD", "ORIG_HEAD"):
        p = dest / ".git" / junk
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return _git(dest, "rev-parse", "HEAD")


def grader_sandbox(task: CodeTask):
    """A sandbox holding ``task``'s buggy tree (no git history, no hidden test) with the testbed
    mounted for an agent; ``SandboxError`` when the package or the testbed cannot be had."""
    from rlonce.envs.code.testbed import make_sandbox

    try:
        sbx = make_sandbox(task.spec, testbed(Path(task.pack_dir) / "cache"), timeout=task.timeout, for_agent=True)
    except (PackageError, PackError) as e:
        raise SandboxError(f"the code testbed of {task.task_id} cannot be built: {e}") from e
    try:
        materialize(task, sbx.workspace, git=False)
    except (PackageError, PackError) as e:
        sbx.close()
        raise SandboxError(f"the repository of {task.task_id} cannot be laid out: {e}") from e
    except BaseException:
        sbx.close()
        raise
    return sbx
