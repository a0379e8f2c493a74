"""The code domain's part in the offline grading tools (``rlonce.envs.pack_audit.PackAudit``).

An audit makes four attempts at each validated task (``AUDIT_AGENTS``): the scripted expert under
two seeds (its detours differ, its fix does not), doing nothing, and deleting or skipping the tests
(``routes.ROUTES``) — a sound task passes the first two and fails the others. A rubric writer
reads the expert under K-1 seeds and one flawed attempt, an early exit appended to the package
(``FLAWED``), so it sees passing attempts that differ in how they worked and one that does not
pass. Attempts run in a ``CodeEnv`` that grades in full (an unchanged workspace is run, not
trusted to fail as validation would allow). The auditor reads the problem statement, the hidden
tests (test ids, then each hidden file) and the reference fix; the rubric writer reads the
repository's listing and the buggy file around the bug.
"""

from __future__ import annotations

import random
from pathlib import Path

from rlonce.envs.code.env import CodeEnv
from rlonce.envs.code.expert import buggy_text, expert_calls
from rlonce.envs.code.routes import ROUTES
from rlonce.envs.code.tasks import CodeTask
from rlonce.envs.code.validate import validated_tasks
from rlonce.envs.pack_audit import Agent, Brief, Call

LISTING_FILES = 80
"""Repository files listed for the rubric writer."""
WINDOW_LINES = 40
"""Lines of the buggy file shown on each side of the bug."""


def expert_agent(seed: int) -> Agent:
    """The scripted expert under ``seed`` (its detours), without its final ``submit``."""
    def calls(task: CodeTask) -> list[Call]:
        return [(c.name, c.arguments) for c in expert_calls(task, random.Random(seed)) if c.name != "submit"]
    return f"expert (seed {seed})", calls


AUDIT_AGENTS: tuple[Agent, ...] = (expert_agent(0), expert_agent(1), ("no-op", lambda task: []),
                                   ("delete_or_skip_tests", ROUTES["delete_or_skip_tests"]))
FLAWED: Agent = ("exit_early_status_0", ROUTES["exit_early_status_0"])


def tests_text(task: CodeTask) -> str:
    """The hidden tests as the auditor reads them: the test ids, then each hidden file."""
    files = "\n".join(f"### {path}\n{text}" for path, text in sorted(task.hidden_files.items()))
    return f"fail-to-pass: {', '.join(task.f2p)}\npass-to-pass: {', '.join(task.p2p) or '(none)'}\n{files}"


def repository_text(task: CodeTask) -> str:
    """The repository as the rubric writer reads it: its files, then the buggy file around the bug."""
    tree, m = task.tree(), task.mut
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    files = [f for f in files if f not in task.hidden_files and "__pycache__" not in f]
    more = f"\n[... {len(files) - LISTING_FILES} more files]" if len(files) > LISTING_FILES else ""
    lines = buggy_text(task).splitlines()
    lo, hi = max(0, m.line - 1 - WINDOW_LINES), m.line + WINDOW_LINES
    window = "\n".join(f"{n:5} {ln}" for n, ln in enumerate(lines[lo:hi], lo + 1))
    return (f"### {m.path} (lines {lo + 1}-{min(hi, len(lines))} of {len(lines)})\n{window}\n\n"
            f"### Files\n" + "\n".join(files[:LISTING_FILES]) + more)


class CodePackAudit:
    audit_agents = AUDIT_AGENTS

    def tasks(self, pack: Path) -> list[CodeTask]:
        return validated_tasks(pack)

    def env(self, task: CodeTask) -> CodeEnv:
        return CodeEnv(task)

    def rollout_agents(self, k: int) -> list[Agent]:
        return [expert_agent(0)] if k == 1 else [*(expert_agent(i) for i in range(k - 1)), FLAWED]

    def brief(self, task: CodeTask) -> Brief:
        return Brief(task.problem, tests_text(task), dict(task.hidden_files), task.fix_diff())

    def repository(self, task: CodeTask) -> str:
        return repository_text(task)


PACK_AUDIT = CodePackAudit()
