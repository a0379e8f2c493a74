"""The agent loop every arm shares: ask, act, observe — until the agent submits or a limit is hit.

Every way out is a typed exception (``Submitted``, ``LimitsExceeded``, ``FormatError``) caught
by the caller, ``rlonce.rollout.runner.run_sequence``. The loop speaks to the model only
through its arm's wire-protocol client, so a built-in arm exercises the same gateway path an
outside agent does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from rlonce.envs.base import Environment
from rlonce.harness.arms import Arm
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.clients import Client


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
                answer = args.get("answer")
                if not isinstance(answer, str):
                    if session is not None:
                        session.flag_last("malformed_tool_call")
                    raise FormatError("submit needs a string 'answer'")
                raise Submitted(answer)
            if turn == limits.max_turns:
                raise LimitsExceeded(f"no submission within {limits.max_turns} turns")
            out = await tools[name].run(env, args)
            results.append((cid, arm.observe(out, limits.max_obs_chars)))
            log.append(f"{name} {args} -> {arm.observe(out, 200)}")
        if arm.compaction and reply.context_tokens >= limits.compact_at * max_context:
            client.restart(f"{env.user_prompt()}\n\nWork so far (the context was compacted):\n" + "\n".join(log))
        else:
            client.give(results)
    raise LimitsExceeded(f"no submission within {limits.max_turns} turns")
