"""Hostile input against a domain's tools and graders: the probe of the rule of blame.

Whatever the policy writes — a NUL, a lone surrogate, a megabyte, a path that climbs out of the
workspace, newlines, bytes that are not UTF-8, links and FIFOs where a grader reads — is the
policy's failed attempt (graded, trained), never an infrastructure failure (``rlonce.errors``,
docs/security.md). ``probe_hostile_input`` runs a domain's environment through the real rollout
path (``run_sequence``: its sandboxes, the in-process gateway, every harness arm the domain
offers) with a scripted model whose tool calls fill every string argument of every tool with each
hostile value, and whose submissions and single-turn replies are hostile too; it counts the
episodes that became infrastructure failures (the goal is 0). ``rlonce probe <domain>`` reports
it beside the domain's own routes.

The scripted model speaks through a byte-level tokenizer (one token a UTF-8 byte), so the probe
needs no model weights: what is tested is the path from the policy's text to the tools and the
grader, which the tokenizer does not change.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

from rlonce.core.records import Status
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.errors import MAX_ARGUMENT_CHARS
from rlonce.harness.arms import ARMS, get_arm
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.runner import RolloutSpec, run_sequence

MEGABYTE = 1 << 20
HOSTILE = {
    "nul": "a\x00b",
    "surrogate": "x\ud800y",
    "escape": "\udcff\udcfe",
    "climb": "../../../../etc/passwd",
    "absolute": "/etc/shadow",
    "newlines": "a\nb\n\n/work/../x\n",
}
"""Hostile strings as the model's JSON carries them (``\\u0000``, ``\\ud800`` escapes)."""
UNSENDABLE = ("surrogate", "escape")
"""Values no client can send back: the gateway refuses the whole turn (a malformed tool call)."""
PLANT = "printf '\\377\\376\\000X:1\\n' > bad.bin; ln -sf /etc/shadow link.bin; mkfifo fifo.bin; mkdir -p dir.bin"
"""A command leaving what a grader must not choke on: bytes that are not UTF-8, a link, a FIFO, a folder."""
ANSWERS = (*HOSTILE.values(), "y" * (MAX_ARGUMENT_CHARS + 1), "bad.bin", "link.bin", "fifo.bin", "dir.bin",
           "/work/bad.bin", "./../bad.bin", "", " ")
REPLIES = ("a\x00b", "y" * MEGABYTE, "X:1\n\x00\x01\x7f", '<tool_call>{"name": "bash"}</tool_call>', "\ufffd" * 64)
"""Single-turn replies: text as a tokenizer can give it (no lone surrogates)."""
FMT = get_format("hermes")
TURN_BYTES = 3000
"""The longest turn of tool calls but the megabyte's: the Anthropic arm's client asks for at most
4096 tokens a turn, one token a byte here."""


def byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8", "surrogatepass"))


def byte_decode(ids: list[int]) -> str:
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", "replace")


def tool_turn(calls: list[tuple[str, object]]) -> str:
    """An assistant turn of tool calls, its JSON ASCII-escaped as a model writes it."""
    return "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)


def tool_turns(calls: list[tuple[str, object]], limit: int = TURN_BYTES) -> list[str]:
    """``calls`` over as few turns as keep each under ``limit`` bytes (a call longer than that alone)."""
    turns, cur = [], []
    for c in calls:
        if cur and len(tool_turn([*cur, c])) > limit:
            turns.append(tool_turn(cur))
            cur = []
        cur.append(c)
    return [*turns, tool_turn(cur)] if cur else turns


def hostile_calls(tools: dict) -> list[tuple[str, dict]]:
    """Each tool but ``submit`` with each sendable hostile value in every string argument, and with
    the wrong type."""
    calls = []
    for name, tool in tools.items():
        if name == "submit":
            continue
        props = tool.schema.get("parameters", {}).get("properties", {})
        strings = [k for k, p in props.items() if p.get("type", "string") == "string"] or list(props) or ["x"]
        calls += [(name, dict.fromkeys(strings, v)) for k, v in HOSTILE.items() if k not in UNSENDABLE]
        calls.append((name, dict.fromkeys(strings, 7)))
    return calls


@dataclass
class Episode:
    arm: str
    label: str
    status: str
    passed: bool
    policy_input_errors: float
    cause: str | None


def _spec(encode=byte_encode, decode=byte_decode) -> RolloutSpec:
    return RolloutSpec(encode=encode, decode=decode, chat_format=FMT, sampling=SamplingParams(max_tokens=10 * MEGABYTE),
                       limits=HarnessLimits(max_turns=1000, max_obs_chars=200), max_context=40 * MEGABYTE)


async def _toolset(env_factory, task, arm: str) -> dict:
    """The tools ``arm`` offers in an environment of ``task`` (set up: MCP services list theirs)."""
    env = env_factory(task)
    try:
        await env.setup()
        return get_arm(arm).toolset(env)
    finally:
        await env.cleanup()


def episodes(tools: dict | None, arm: str) -> list[tuple[str, list[str]]]:
    """(label, scripted turns) of every hostile episode under ``arm`` (``tools``: what it offers;
    None for a single-turn arm)."""
    if tools is None:
        return [(f"reply:{r[:12]!r}", [r]) for r in REPLIES]
    bash = next((n for n in ("bash", "Bash", "exec_command") if n in tools), None)
    plant = [tool_turn([(bash, {next(iter(tools[bash].schema["parameters"]["properties"])): PLANT})])] if bash else []
    # a megabyte once (the size cap is the boundary's, whatever the tool), under the arm whose
    # protocol lets a turn be that long
    calls = hostile_calls(tools)
    big = [tool_turn([(calls[0][0], {next(iter(calls[0][1])): "y" * MEGABYTE})])] if arm == "mini-bash" else []
    first = next(n for n in tools if n != "submit")
    out = [("every tool", [*tool_turns(calls), *big, *plant, tool_turn([("submit", {"answer": "bad.bin"})])]),
           ("unknown tool", [tool_turn([("no_such_tool", {"x": "y"})])]),
           ("arguments not an object", [tool_turn([(first, ["not", "an", "object"])])])]
    # refused by the gateway's parse whatever the tool: once an arm
    out += [(f"{first} {v}", [tool_turn([(first, dict.fromkeys(tools[first].schema.get("parameters", {}).get(
        "properties", {}) or ["x"], HOSTILE[v]))])]) for v in UNSENDABLE]
    if arm == "mini-bash":  # what a grader is handed is the same under every arm
        out += [(f"submit {a[:24]!r}", [*plant, tool_turn([("submit", {"answer": a})])]) for a in ANSWERS]
    return out


async def probe_hostile_input(env_factory, task, arms: list[str], *, encode=byte_encode, decode=byte_decode,
                              concurrency: int = 4) -> dict:
    """Run every hostile episode of ``task`` under each of ``arms``: ``{"episodes", "infra",
    "passed", "policy_input_errors", "rows"}`` (``infra``: how many became infrastructure
    failures, the goal 0; ``passed``: how many a grader passed, also 0)."""
    spec, sem = _spec(encode, decode), asyncio.Semaphore(concurrency)

    async def one(arm: str, label: str, turns: list[str]) -> Episode:
        async with sem:
            seq = await run_sequence(task, env_factory, ScriptedEngine(turns, encode), spec, arm=arm)
        return Episode(arm, label, seq.status.value, seq.passed, seq.metrics.get("policy_input_errors", 0.0),
                       seq.cause if seq.status is Status.INFRA else None)

    jobs = []
    for arm in arms:
        tools = None if ARMS[arm].single_turn else await _toolset(env_factory, task, arm)
        jobs += [one(arm, label, turns) for label, turns in episodes(tools, arm)]
    rows = await asyncio.gather(*jobs)
    return {"episodes": len(rows), "infra": sum(r.status == Status.INFRA.value for r in rows),
            "passed": sum(r.passed for r in rows), "policy_input_errors": sum(r.policy_input_errors for r in rows),
            "rows": [asdict(r) for r in rows]}


def arms_for(single_turn: bool, tools: bool) -> list[str]:
    """The harness arms a domain offers: single-turn where it answers in one reply, the tool arms
    where it has tools."""
    return [a for a, arm in ARMS.items() if (arm.single_turn and single_turn) or (not arm.single_turn and tools)]


def format_hostile(report: dict) -> str:
    """One line for a probe's report, and one per episode that failed the rule."""
    head = (f"hostile input: {report['episodes']} episodes, {report['infra']} infrastructure failures (goal 0), "
            f"{report['passed']} passed (goal 0), {report['policy_input_errors']:.0f} tool calls answered as the "
            "policy's error")
    bad = [f"  {r['arm']} {r['label']}: {r['status']} {r['cause'] or ''}" for r in report["rows"]
           if r["status"] == Status.INFRA.value or r["passed"]]
    return "\n".join([head, *bad])
