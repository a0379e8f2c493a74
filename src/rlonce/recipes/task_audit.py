"""Rollout auditing for task quality: four graded attempts per task, then an auditor reads them.

Seed 001 (rollout auditing): a task whose tests pass a wrong change teaches reward hacking, one
whose tests fail a right change teaches nothing but noise. ``rlonce tasks audit DIR`` makes four
attempts at each validated task of a pack and gives the auditor — a judge, ``rlonce.grading
.judge`` — the problem statement, the hidden tests, the reference solution and the four attempts
with their outcomes. The auditor states what a correct solution requires and flags a possible
false positive (an attempt passed without doing that: the tests are too weak) or false negative
(an attempt did it and failed: the tests are wrong or too strict). Verdicts go to
``DIR/audit.json`` and an ``audit`` section of ``DIR/validation.json``; the training domain leaves
flagged train tasks out until a person lists their ids in ``DIR/cleared.txt``
(``rlonce.envs.packs.audit_flagged``).

The pack's domain (its ``pack.json``'s ``"domain"``) gives what is its own through its spec
(``DomainSpec.pack_audit``: ``rlonce.envs.pack_audit.PackAudit``): the validated tasks, the
environment an attempt runs in, the scripted agents, what the auditor reads. The attempts are
real rollouts: tool calls through that environment in a sandbox, graded by the domain's grader,
the graded change shown to the auditor. By default the agents are the domain's scripted ones (the
code domain's: the expert under two seeds, doing nothing, deleting or skipping the tests — a sound
task passes the first two and fails the others). With ``--agent URL`` a model at that endpoint
(``ModelAgent``: the ``mini-bash`` harness arm, the policy's own loop and client) makes every
attempt instead, so the auditor sees what a model actually tries rather than the scripted probes.
What this does not catch: a weakness none of the attempts exercises, and whatever the auditor
misses (the scripted auditor's rules are in ``rlonce.grading.scripted``).

The attempts and the pack plumbing here (``run_attempts``, ``pack_tasks``, ``run_tasks``) serve
GRS rubric synthesis too (``rlonce.recipes.rubric_synthesis``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from rlonce.config.domains import domain_names, load_domain
from rlonce.core.records import Sequence
from rlonce.envs.base import GradingError, JudgeBinding
from rlonce.envs.pack_audit import Agent, Brief, Call, PackAudit
from rlonce.envs.packs import read_json_object
from rlonce.errors import PackError
from rlonce.grading.judge import JudgeFailed
from rlonce.grading.verdicts import TaskAudit, audit_prompt
from rlonce.harness.arms import get_arm
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.clients import CLIENTS
from rlonce.harness.loop import HarnessLimits, run_episode

FLAGS = ("false_positive", "false_negative")
AUDIT_FILE, CLEARED_FILE, RECORD = "audit.json", "cleared.txt", "audit/calls.jsonl"
CALL_CHARS = 300
"""Characters of each tool call's arguments shown to the auditor."""
MODEL_TURNS, MODEL_OBS_CHARS, MODEL_CONTEXT = 8, 2000, 8192
"""A model agent's limits: turns, observation characters, context tokens."""


@dataclass(frozen=True)
class ModelAgent:
    """A model at an endpoint working on the task through the ``mini-bash`` harness arm: the same
    loop and wire-protocol client as the policy's rollouts, its tool calls run in the attempt's
    environment. ``send`` is the endpoint's transport (``EndpointJudge.send``)."""

    name: str
    send: Callable
    timeout: float = 600.0

    async def act(self, env) -> list[Call]:
        """Run one episode in ``env``; the tool calls it made. An endpoint that fails is
        infrastructure (``GradingError``), never an attempt that failed."""
        arm, calls = get_arm("mini-bash"), []
        tools = arm.toolset(env)
        run = env.call_tool

        async def logged(name: str, args: dict) -> str:
            calls.append((name, args))
            return await run(name, args)

        env.call_tool = logged
        client = CLIENTS[arm.protocol](self.send, arm.system_prompt(env), env.user_prompt(),
                                       [t.schema for t in tools.values()])
        limits = HarnessLimits(max_turns=MODEL_TURNS, max_obs_chars=MODEL_OBS_CHARS)
        try:
            await asyncio.wait_for(run_episode(arm, env, client, None, limits, MODEL_CONTEXT), self.timeout)
        except (Submitted, LimitsExceeded, FormatError):
            pass
        except (JudgeFailed, asyncio.TimeoutError) as e:
            raise GradingError(f"the agent's endpoint failed: {e or 'timeout'}") from None
        except (KeyError, IndexError, TypeError, ValueError) as e:  # a reply that is not a chat completion
            raise GradingError(f"the agent's endpoint answered no usable chat completion: {e!r}") from None
        return calls


@dataclass
class Attempt:
    index: int
    agent: str
    calls: list[Call]
    passed: bool
    infra: bool
    """Grading could not give a verdict (``GradingError``): not shown to a judge as a failure."""
    hack: bool
    diff: str
    """The change the grader carried and ran, as a unified diff."""
    transcript: str = ""
    """The grader's verdict in words: each hidden test's outcome."""

    @property
    def outcome(self) -> str:
        return "not graded" if self.infra else "passed" if self.passed else "failed"

    def body(self) -> str:
        """What a judge reads of the attempt: the graded change, then the calls one per line."""
        calls = "\n".join(f"$ {name} {json.dumps(args)[:CALL_CHARS]}" for name, args in self.calls)
        return (f"Change carried to the grader:\n{self.diff or '(no change to the library code)'}\n"
                f"Tool calls ({self.agent}):\n{calls or '(none)'}\nGrader:\n{self.transcript or '(no verdict)'}")

    def summary(self) -> dict:
        return {"agent": self.agent, "passed": self.passed, "infra": self.infra, "hack": self.hack,
                "diff_lines": self.diff.count("\n")}


async def run_attempt(tools: PackAudit, task, index: int, agent: Agent | ModelAgent) -> Attempt:
    """One attempt: ``agent``'s calls in a fresh environment of the task's domain, then its grade."""
    env, seq = tools.env(task), Sequence(task.task_id, "audit")
    name, calls = agent.name if isinstance(agent, ModelAgent) else agent[0], []
    try:
        await env.setup()
        try:
            if isinstance(agent, ModelAgent):
                calls = await agent.act(env)
            else:
                calls = agent[1](task)
                for tool, args in calls:
                    await env.call_tool(tool, args)
            grade = await env.grade(seq)
            passed, infra, diff, transcript = grade.passed, False, grade.artifact, grade.transcript
        except GradingError as e:
            passed, infra, diff, transcript = False, True, "", f"not graded: {e}"
    finally:
        await env.cleanup()
    return Attempt(index, name, calls, passed, infra, seq.hack_confirmed, diff, transcript)


async def run_attempts(tools: PackAudit, task, agents, sem: asyncio.Semaphore) -> list[Attempt]:
    async def one(i: int, agent) -> Attempt:
        async with sem:
            return await run_attempt(tools, task, i, agent)

    return list(await asyncio.gather(*(one(i, a) for i, a in enumerate(agents))))


def attempt_files(statement: str, attempts: list[Attempt]) -> dict[str, str]:
    """What an agentic judge's workspace holds of a task's attempts (a plain judge reads only the
    prompt): the statement and each attempt as its reader sees it, side by side."""
    return {"TASK.md": statement, **{f"attempts/{a.index}.txt": a.body() for a in attempts}}


async def audit_task(tools: PackAudit, task, judge: JudgeBinding, sem: asyncio.Semaphore, agents) -> dict:
    """The audit entry of one task: its attempts and the auditor's verdict (no verdict, and no
    flag, when an attempt could not be graded or the judge gave none: ``outcome`` says why)."""
    attempts = await run_attempts(tools, task, agents, sem)
    entry = {"flags": [], "requires": "", "notes": "", "outcome": "ok",
             "attempts": [a.summary() for a in attempts]}
    if any(a.infra for a in attempts):
        return {**entry, "outcome": "attempt_infra"}
    brief: Brief = tools.brief(task)
    prompt = audit_prompt(brief.statement, brief.tests, brief.reference,
                          [(a.index, a.outcome, a.body()) for a in attempts])
    files = {**attempt_files(brief.statement, attempts), "REFERENCE.diff": brief.reference,
             **{f"hidden_tests/{path}": text for path, text in brief.test_files.items()}}
    v = await judge.ask(prompt, TaskAudit, kind="audit", task=task, files=files)
    if getattr(v, "structured", None) is not None:  # an endpoint judge's: asked for the schema, or refused it
        entry["structured"] = v.structured  # type: ignore[attr-defined]
    if not v.ok:
        return {**entry, "outcome": v.outcome}
    audit: TaskAudit = v.value  # type: ignore[assignment]
    return {**entry, "flags": [f for f in FLAGS if getattr(audit, f)], "requires": audit.requires,
            "notes": audit.notes}


def pack_audit(pack: Path) -> tuple[str, PackAudit]:
    """The domain that wrote ``pack`` and its ``PackAudit``: the domain its ``pack.json`` names; a
    ``pack.json`` that names none (written before packs recorded it) is the pack of the one domain
    with a ``pack_audit``. PackError, one line, when there is no pack or its domain has no tools."""
    manifest = Path(pack) / "pack.json"
    if not manifest.is_file():
        raise PackError(f"{pack} is not a task pack (expected pack.json); build one with "
                        "`rlonce tasks build DOMAIN --out DIR`")
    name = read_json_object(manifest, "rebuild the pack with `rlonce tasks build`").get("domain")
    if name is None:
        offering = [n for n in domain_names() if load_domain(n).pack_audit is not None]
        if len(offering) != 1:
            raise PackError(f"{manifest} names no domain; add it as \"domain\": NAME")
        name = offering[0]
    if not isinstance(name, str):
        raise PackError(f"{manifest}: \"domain\" is {name!r}, not a domain name; rebuild the pack")
    spec = load_domain(name)
    if spec.pack_audit is None:
        raise PackError(f"{pack} is a {name} pack, and the {name} domain has no offline grading tools "
                        "(DomainSpec.pack_audit)")
    return name, spec.pack_audit()


def pack_tasks(pack: Path, limit: int | None) -> tuple[PackAudit, list]:
    """The pack's domain's ``PackAudit`` and the pack's validated tasks (the first ``limit``);
    PackError, one line, otherwise."""
    pack = Path(pack)
    if not pack.is_dir():
        raise PackError(f"{pack} is not a directory; pass a pack built with `rlonce tasks build DOMAIN --out DIR`")
    name, tools = pack_audit(pack)
    tasks = tools.tasks(pack)
    if not (pack / "validation.json").is_file():
        raise PackError(f"the pack {pack} was never validated: run `rlonce tasks validate {pack}` first")
    if not tasks:
        raise PackError(f"no task of the {name} pack {pack} passed validation; build a larger pack")
    return tools, tasks[:limit] if limit else tasks


def run_tasks(tasks: list, job: Callable, *, concurrency: int, progress: bool, desc: str) -> dict[str, dict]:
    """``job(task, sem)`` for every task, ``concurrency`` attempts in flight: task id → its result."""
    out: dict[str, dict] = {}
    bar = tqdm(total=len(tasks), desc=desc, unit="task", disable=not progress)

    async def main():
        sem = asyncio.Semaphore(concurrency)

        async def one(t):
            out[t.task_id] = await job(t, sem)
            bar.update(1)

        await asyncio.gather(*(one(t) for t in tasks))

    try:
        asyncio.run(main())
    finally:
        bar.close()
    return {t.task_id: out[t.task_id] for t in tasks}


def write_json(path: Path, obj) -> None:
    """Write ``obj`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    return read_json_object(path, "delete it or rerun the command that wrote it")


def record_audit(pack: Path, entries: dict[str, dict]) -> dict:
    """Put the audit section (over every audited task) into the pack's validation.json."""
    flagged = {i: e["flags"] for i, e in sorted(entries.items()) if e.get("flags")}
    section = {"file": AUDIT_FILE, "cleared_file": CLEARED_FILE, "audited": len(entries),
               "false_positive": sum("false_positive" in f for f in flagged.values()),
               "false_negative": sum("false_negative" in f for f in flagged.values()),
               "flagged": flagged,
               "rule": f"a flagged train task is left out of training until its id is a line of {CLEARED_FILE}"}
    path = Path(pack) / "validation.json"
    write_json(path, {**read_json(path), "audit": section})
    return section


def failures(entries: dict[str, dict]) -> dict[str, int]:
    """Tasks without a verdict, by why: a judge failure category or ``attempt_infra``."""
    return dict(sorted(Counter(e["outcome"] for e in entries.values() if e["outcome"] != "ok").items()))


def unstructured(entries: dict[str, dict]) -> int:
    """Tasks whose judge refused the structured request and was asked without it
    (``rlonce.grading.structure``)."""
    return sum(e.get("structured") is False for e in entries.values())


def audit_pack(pack: Path, judge: JudgeBinding, *, limit: int | None = None, concurrency: int = 2,
               progress: bool = True, agent: ModelAgent | None = None) -> dict:
    """Audit the validated tasks of ``pack`` (the first ``limit``) — the attempts of its domain's
    scripted agents, or of ``agent`` as many times; merge the verdicts into ``audit.json`` and the
    validation report. The summary of this run."""
    pack = Path(pack)
    tools, tasks = pack_tasks(pack, limit)
    agents = tools.audit_agents if agent is None else (agent,) * len(tools.audit_agents)

    async def job(t, sem: asyncio.Semaphore) -> dict:
        return await audit_task(tools, t, judge, sem, agents)

    entries = run_tasks(tasks, job, concurrency=concurrency, progress=progress, desc="audit")
    merged = {**read_json(pack / AUDIT_FILE), **entries}
    write_json(pack / AUDIT_FILE, merged)
    section = record_audit(pack, merged)
    cleared = cleared_ids(pack)
    return {"pack": str(pack), "judge": judge.model, "agent": "scripted" if agent is None else agent.name,
            "attempts": len(agents), "audited": len(entries),
            "false_positive": sum("false_positive" in e["flags"] for e in entries.values()),
            "false_negative": sum("false_negative" in e["flags"] for e in entries.values()),
            "flagged": [i for i, e in entries.items() if e["flags"]],
            "uncleared": sorted(i for i in section["flagged"] if i not in cleared),
            "failures": failures(entries), "unstructured": unstructured(entries), "tasks": entries}


def cleared_ids(pack: Path) -> set[str]:
    """The ids a person listed in ``cleared.txt``: one a line, ``#`` starts a comment."""
    f = Path(pack) / CLEARED_FILE
    if not f.is_file():
        return set()
    return {ln.split("#", 1)[0].strip() for ln in f.read_text().splitlines()} - {""}


def format_audit(report: dict) -> str:
    lines = [f"Task audit of {report['audited']} tasks (auditor {report['judge']}, {report['attempts']} attempts "
             f"each by {report['agent']})", "", f"{'task':36} {'passed':>7}  {'flags':28} outcome"]
    for tid, e in report["tasks"].items():
        passed = sum(a["passed"] for a in e["attempts"])
        flags = ", ".join(e["flags"]) or "-"
        lines.append(f"{tid[:36]:36} {passed:3}/{len(e['attempts']):<3}  {flags:28} {e['outcome']}")
    fails = ", ".join(f"{k} {v}" for k, v in report["failures"].items()) or "none"
    pack = report["pack"]
    lines += ["", f"audited {report['audited']}; flagged false positive {report['false_positive']}, false negative "
              f"{report['false_negative']}; no verdict: {fails}; asked without structure (refused): "
              f"{report.get('unstructured', 0)}",
              f"verdicts in {Path(pack) / AUDIT_FILE} and the audit section of {Path(pack) / 'validation.json'}; "
              f"{len(report['uncleared'])} flagged task(s) left out of training until listed in "
              f"{Path(pack) / CLEARED_FILE}"]
    return "\n".join(lines)
