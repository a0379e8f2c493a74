"""mini-bash: the smallest useful agent harness — a system prompt, ``bash`` + ``submit``, a context policy.

The loop asks the model for one turn, parses its tool call, runs it in the environment and
feeds the (truncated) output back, until the model submits or a limit is hit. Every way out
is a typed exception (``Submitted``, ``LimitsExceeded``, ``FormatError``) caught by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from rlonce.engine.base import SamplingParams
from rlonce.gateway.session import BudgetExceeded, TokenSession
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.model.chat import ToolCallParseError

ARM = "mini-bash"


@dataclass(frozen=True)
class HarnessLimits:
    max_turns: int = 3
    max_obs_chars: int = 600
    """Context policy: observations longer than this keep their head and tail."""
    render_tools: bool = True
    """Render the tool schemas into the system prompt (a model that learned its tools may skip them)."""


def truncate_observation(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


async def run_episode(env, session: TokenSession, sampling: SamplingParams, limits: HarnessLimits) -> NoReturn:
    """Run the agent loop; it always ends by raising an ``EpisodeEnd``."""
    session.open(env.system_prompt(), env.user_prompt(), env.tools() if limits.render_tools else [])
    for turn in range(1, limits.max_turns + 1):
        try:
            text, gen = await session.generate(sampling)
        except BudgetExceeded as e:
            raise LimitsExceeded(str(e)) from None
        if gen.finish_reason != "stop":
            raise LimitsExceeded(f"turn {turn} ended by {gen.finish_reason}")
        try:
            calls = session.fmt.parse_tool_calls(text)
        except ToolCallParseError as e:
            session.flag_last("malformed_tool_call")
            raise FormatError(str(e)) from None
        call = calls[0]
        if call.name == "submit":
            answer = call.arguments.get("answer")
            if not isinstance(answer, str):
                session.flag_last("malformed_tool_call")
                raise FormatError("submit needs a string 'answer'")
            raise Submitted(answer)
        if call.name not in {t["name"] for t in env.tools()}:
            session.flag_last("unknown_tool")
            raise FormatError(f"unknown tool {call.name!r}")
        if turn == limits.max_turns:
            break
        result = await env.call_tool(call.name, call.arguments)
        try:
            session.observe([truncate_observation(result, limits.max_obs_chars)])
        except BudgetExceeded as e:
            raise LimitsExceeded(str(e)) from None
    raise LimitsExceeded(f"no submission within {limits.max_turns} turns")
