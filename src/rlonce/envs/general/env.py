"""General tool use: the agent works through the office's services as MCP tools, and is graded
on the services' final state.

Setup rebuilds the task's world (``world.World``), starts the task's services in a sandbox of
their own (``mcp_host.ServiceHost``: real MCP servers over their own SQLite databases) and a
second sandbox for the agent's shell. The agent sees the services' tools as ``tools/list``
returned them (``mcp_tools``, offered by every harness arm as ``mcp__<service>__<tool>``), bash,
and ``submit``. Grading reads the final databases and documents out of the service sandbox and
evaluates the task's atomic rubric items (``rubric``; ``judged`` items are asked of the run's judge,
``judged``). Reward: all items passed → 1, else 0, by
default (``reward = "all"``); ``"fraction"`` gives the share of items passed. All-or-nothing is the
default because a fraction pays for the negative items, which an agent that does nothing passes.
"""

from __future__ import annotations

import sqlite3
import stat
import tempfile
from pathlib import Path

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import GradingError, JudgeBinding
from rlonce.envs.general.judged import judge_items, judged_text
from rlonce.envs.general.mcp_host import ServiceError, ServiceHost
from rlonce.envs.general.rubric import Final, evaluate
from rlonce.envs.general.tasks import GeneralTask
from rlonce.envs.general.world import ME, TODAY, World
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, SUBMIT_TOOL, bash_command, run_bash
from rlonce.sandbox import hostfs
from rlonce.sandbox.bwrap import BwrapSandbox
from rlonce.sandbox.limits import command_limits

SYSTEM_PROMPT = (f"You are an office assistant for {ME}; today is {TODAY}. Use the mcp__ tools to read and change "
                 "mail, calendar, tickets, ledger and documents. Do only what the task asks, then call submit with "
                 "your answer.")
REWARDS = ("all", "fraction")
MAX_DOC_BYTES = 1 << 20


class GeneralEnv:
    def __init__(self, task: GeneralTask, *, reward: str = "all", judge: JudgeBinding | None = None,
                 agreement: JudgeBinding | None = None):
        if reward not in REWARDS:
            raise ValueError(f"unknown general reward {reward!r}; known: {list(REWARDS)}")
        self.task, self.reward = task, reward
        self.judge, self.agreement = judge, agreement
        """The run's judge and agreement judge for ``judged`` items (None: those items are left out)."""
        self.world = World.make(task.seed)
        self.initial = self.world.state()
        self.services = ServiceHost(list(task.services), {k: v for k, v in self.initial.items()
                                                          if k.split(".")[0].split("/")[0] in task.services},
                                    me=ME, today=TODAY)
        self.limits = command_limits(10, output_bytes=8192)
        """The agent's bash commands' limits."""
        self.sandbox: BwrapSandbox | None = None
        self.metrics: dict[str, float] = {}

    async def setup(self) -> None:
        self.sandbox = BwrapSandbox(self.limits)
        self.sandbox.put_file("README.txt", "Your scratch space. The office's data lives behind the mcp__ tools.\n")
        await self.services.start()

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def user_prompt(self) -> str:
        return self.task.prompt

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    def mcp_tools(self) -> list[dict]:
        """The services' tools as their servers listed them (``service__tool``)."""
        return [schema for _, schema in self.services.tools.values()]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name == "bash":
            command = bash_command(arguments)
            return BASH_USAGE if command is None else await run_bash(self.sandbox, command)
        if name not in self.services.tools:
            return f"[error: unknown tool {name!r}]"
        out, failure = await self.services.call(name, arguments)
        self.metrics["tool_calls"] = self.metrics.get("tool_calls", 0.0) + 1
        if failure:
            key = f"tool_error_{failure}"
            self.metrics[key] = self.metrics.get(key, 0.0) + 1
        return out

    def _final(self, answer: str, scratch: Path) -> Final:
        init, final = {}, {}
        for service in self.task.services:
            if service == "files":
                continue
            for which, data, store in (("init", self.initial[f"{service}.db"], init),
                                       ("final", self.services.state_file(f"{service}.db"), final)):
                path = scratch / f"{which}-{service}.db"
                path.write_bytes(data)
                store[service] = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        docs_init = {k.removeprefix("files/"): v.decode() for k, v in self.initial.items() if k.startswith("files/")}
        docs_final = self._documents() if "files" in self.task.services else docs_init
        return Final(init, final, docs_init, docs_final, answer)

    def _documents(self) -> dict[str, str]:
        root = self.services.sandbox.workspace / "files"
        out = {}
        for rel, st in hostfs.walk(root, max_depth=8):
            if stat.S_ISREG(st.st_mode):
                out[rel] = hostfs.read_file(root, rel, MAX_DOC_BYTES).decode("utf-8", errors="replace")
        return out

    async def grade(self, sequence: Sequence) -> Grade:
        scratch = Path(tempfile.mkdtemp(prefix="rlonce-general-"))
        final = None
        try:
            try:
                final = self._final(sequence.answer or "", scratch)
            except (ServiceError, OSError, sqlite3.Error, hostfs.HostileFile) as e:
                raise GradingError(f"the final service state could not be read: {e}") from None
            verdicts = evaluate(list(self.task.items), final)
            texts = self._judged_texts(final)
        finally:
            for db in ([*final.init.values(), *final.final.values()] if final else []):
                db.close()
            hostfs.remove_tree(scratch)
        judged = await judge_items([it for it in self.task.items if it.kind == "judged"], texts, self.judge,
                                   self.agreement)
        verdicts.update(judged.verdicts)
        self.metrics.update({f"grade/{k}": v for k, v in judged.metrics.items()})
        passed = all(verdicts.values())
        self.metrics.update({f"item_{it.kind}_passed": float(verdicts[it.name]) for it in self.task.items
                             if it.name in verdicts})
        self.metrics["items_passed"] = sum(verdicts.values()) / len(verdicts)
        reward = float(passed) if self.reward == "all" else sum(verdicts.values()) / len(verdicts)
        lines = [f"{'left out' if it.name not in verdicts else 'pass' if verdicts[it.name] else 'FAIL'} "
                 f"[{it.kind}] {it.name}" for it in self.task.items]
        return Grade(reward, passed=passed, transcript="\n".join(lines))

    def _judged_texts(self, final: Final) -> dict[str, str | None]:
        out = {}
        for it in self.task.items:
            if it.kind == "judged":
                try:
                    out[it.name] = judged_text(final, it.args["service"], it.args["sql"], it.args["params"])
                except sqlite3.Error:
                    out[it.name] = None
        return out

    async def cleanup(self) -> None:
        await self.services.close()
        if self.sandbox is not None:
            self.sandbox.close()
