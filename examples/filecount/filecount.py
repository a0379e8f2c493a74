"""filecount: a complete rlonce domain written outside the package (docs/domains.md walks through it).

The agent gets a workspace holding a folder ``box/`` of files and is asked how many there are; it
can look with bash and answers with submit. Train it beside toolfind, from this folder:

    rlonce train mixed.toml            # [[sources]] name = "filecount:DOMAIN"
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial

from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec
from rlonce.core.records import Grade, Sequence
from rlonce.envs.domains import Domain
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, SUBMIT_TOOL, bash_command, run_bash
from rlonce.model.chat import ToolCall
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import command_limits


class Options(DomainOptions):
    max_files: int = Field(5, ge=1, le=50)
    """The most files a task's box holds (each task draws 1 to max_files)."""


@dataclass(frozen=True)
class Task:  # data only: frozen, picklable; task_id and source are what the runtime reads
    task_id: str
    files: tuple[str, ...]
    source: str = "filecount"


def make_task(max_files: int, split: str, index: int) -> Task:
    """Task ``index`` of ``split``: a pure function of both, so held-out tasks never meet training ones."""
    rng = random.Random(f"filecount/{split}/{index}")
    names = [f"{rng.choice('xyz')}{i}.txt" for i in range(rng.randint(1, max_files))]
    return Task(f"filecount-{split}-{index}", tuple(names))


class FilecountEnv:
    def __init__(self, task: Task):
        self.task, self.metrics, self.sandbox = task, {}, None

    async def setup(self) -> None:
        self.sandbox = BwrapSandbox(command_limits(5, output_bytes=4096))  # the policy's commands run here only
        for name in self.task.files:
            self.sandbox.put_file(f"box/{name}", "x\n")

    def system_prompt(self) -> str:
        return "Answer from the files in box/: look with bash, then submit."

    def user_prompt(self) -> str:
        return "How many files are in box/?"

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)  # an unknown tool: the policy's format error, not infrastructure
        command = bash_command(arguments)
        return BASH_USAGE if command is None else await run_bash(self.sandbox, command)

    async def grade(self, sequence: Sequence) -> Grade:
        right = (sequence.answer or "").strip() == str(len(self.task.files))
        return Grade(1.0 if right else 0.0, passed=right,
                     transcript=f"submitted {sequence.answer!r}; {len(self.task.files)} files")

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


def expert_turns(task: Task, rng, fmt, *, translate=None, single_turn=False, **kw) -> list[str]:
    """The scripted expert's assistant turns (SFT demonstrations): count with bash, then submit."""
    calls = [ToolCall("bash", {"command": "ls box | wc -l"}), ToolCall("submit", {"answer": str(len(task.files))})]
    return [fmt.assistant_text("", [translate(c) if translate else c]) for c in calls]


def build(options: Options) -> Domain:
    return Domain("filecount", FilecountEnv, partial(make_task, options.max_files), expert=expert_turns)


DOMAIN = DomainSpec(name="filecount", build=build, options=Options, has_expert=True,
                    summary="count the files in a folder with bash (the docs/domains.md example)")
