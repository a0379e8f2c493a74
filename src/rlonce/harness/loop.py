"""The agent loop every arm shares: ask, act, observe — until the agent submits or a limit is hit.

Every way out is a typed exception (``Submitted``, ``LimitsExceeded``, ``FormatError``) caught
by the caller, ``rlonce.rollout.runner.run_sequence``. The loop speaks to the model only
through its arm's wire-protocol client, so a built-in arm exercises the same gateway path an
outside agent does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from rlonce.core.timeouts import Expired
from rlonce.engine.base import EngineError
from rlonce.envs.base import Environment, GradingError
from rlonce.errors import POLICY, blame, cause_of, input_problem
from rlonce.gateway.messages import ProtocolError
from rlonce.harness.arms import Arm
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.clients import Client
from rlonce.harness.tools import Tool
from rlonce.sandbox.base import SandboxError


@dataclass(frozen=True)
class HarnessLimits:
    max_turns: int = 3
    max_obs_chars: int = 600
    """Context policy: the character limit the arm's observation cut applies."""
    render_tools: bool = True
    """Render the tool schemas into the system prompt (a model that learned its tools may skip them)."""
    compact_at: float = 0.75
    """Arms with compaction restart into a new context once a turn fills this fraction of the budget."""
    format_retries: int = 0
    """Turns without a usable tool call answered with a hint (``FORMAT_HINT``) before one ends the episode."""


FORMAT_HINT = "[error: no usable tool call; call one of these tools: {names}]"
TOOL_ERROR = "[error: {name} could not run these arguments: {why}]"

INFRASTRUCTURE = (SandboxError, EngineError, Expired, GradingError, ProtocolError, MemoryError)
"""What a tool's own machinery raises: an infrastructure failure of the sequence, whatever the
arguments were. Everything else a tool raises on the policy's arguments is the policy's failed
call (``rlonce.errors.blame``)."""


def _count(env: Environment, key: str) -> None:
    env.metrics[key] = env.metrics.get(key, 0.0) + 1


async def call_tool(tools: dict[str, Tool], env: Environment, name: str, args, session=None) -> str:
    """One tool call at the boundary where the policy's input meets the tools: an unknown tool,
    arguments that are not an object, that hold a NUL, a lone surrogate or over
    ``MAX_ARGUMENT_CHARS``, and any exception a tool raises on them (``blame`` says ``POLICY``) come
    back as an error observation the model sees, counted as ``policy_input_errors`` (the episode
    goes on and trains). The machinery's exceptions and our own bugs propagate to the retry
    boundary of ``run_sequence``."""
    tool = tools.get(name)
    why = (f"unknown tool; the tools are {', '.join(tools)}" if tool is None or tool.run is None
           else "the arguments must be a JSON object" if not isinstance(args, dict) else input_problem(args))
    if why is None:
        try:
            return await tool.run(env, args)
        except Exception as e:  # noqa: BLE001 - the boundary: whose failure it is decides where it goes
            if blame(e, infrastructure=INFRASTRUCTURE, tool_call=True) != POLICY:
                raise
            why = cause_of(e)
    _count(env, "policy_input_errors")
    if session is not None:
        session.flag_last("unknown_tool" if tool is None or tool.run is None else "malformed_tool_call")
    return TOOL_ERROR.format(name=str(name)[:80], why=why)


def _answer(args, session) -> str:
    """The submitted answer, or ``FormatError`` (the policy's failure, graded) when it is not
    text a grader can take."""
    answer = args.get("answer") if isinstance(args, dict) else None
    problem = "submit needs a string 'answer'" if not isinstance(answer, str) else input_problem(answer)
    if problem:
        if session is not None:
            session.flag_last("malformed_tool_call")
        raise FormatError(f"submit: {problem}")
    return answer


async def run_episode(arm: Arm, env: Environment, client: Client, session, limits: HarnessLimits,
                      max_context: int) -> NoReturn:
    """Run the loop; it always ends by raising an ``EpisodeEnd``. ``session`` is the gateway
    session (in-process), used to flag turns the penalty module should see."""
    tools = arm.toolset(env)
    log: list[str] = []
    retries = limits.format_retries
    for turn in range(1, limits.max_turns + 1):
        reply = await client.ask()
        if reply.truncated:
            raise LimitsExceeded(f"turn {turn} was cut by a token budget")
        if arm.single_turn:
            raise Submitted(reply.text)
        if not reply.calls:
            if session is not None:
                session.flag_last("malformed_tool_call")
            if not retries:
                raise FormatError("the turn holds no usable tool call")
            retries -= 1
            env.metrics["format_retries"] = env.metrics.get("format_retries", 0.0) + 1
            client.say(FORMAT_HINT.format(names=", ".join(tools)))
            continue
        results = []
        for cid, name, args in reply.calls:
            if name == "submit":
                raise Submitted(_answer(args, session))
            if turn == limits.max_turns:
                raise LimitsExceeded(f"no submission within {limits.max_turns} turns")
            out = await call_tool(tools, env, name, args, session)
            results.append((cid, arm.observe(out, limits.max_obs_chars)))
            log.append(f"{name} {args} -> {arm.observe(out, 200)}")
        if arm.compaction and reply.context_tokens >= limits.compact_at * max_context:
            client.restart(f"{env.user_prompt()}\n\nWork so far (the context was compacted):\n" + "\n".join(log))
        else:
            client.give(results)
    raise LimitsExceeded(f"no submission within {limits.max_turns} turns")
