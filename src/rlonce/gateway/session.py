"""The exact-token session: one per rollout sequence, between a client's messages and the engine.

A client (a built-in harness in-process, or an outside agent over HTTP) sends its whole
conversation with every request, as chat APIs do. The session never re-encodes what the model
already said. It keeps, per ``Context``, the messages that context represents and the tokens
that encode them, and on each request finds which context the request extends:

- **extend** — the request's history equals a context's messages (assistant turns compared by
  content and tool calls, the way the client echoes them). Only the new messages (tool
  results, user turns) are encoded — one delta, loss mask 0 — and the model's turn is appended
  exactly as the engine sampled it: ids, log-probs, policy versions.
- **rollback** — the request diverges at the context's last model turn or after it (the client
  edited or regenerated that turn, or re-sent different tool results). The context is cut back
  to the model turn before the divergence and the request's remaining messages are encoded as
  a delta. The sampled tokens cut away are counted (``rollback_dropped_tokens``).
- **branch** — the request rewrote earlier history (compaction, dropped reasoning, edited
  turns). Rolling back would throw away trained turns, so the old context is kept as it is
  and a new ``Context`` opens, the request's whole dialogue rendered as its prompt (mask 0).

Every decision is an entry in ``events``: nothing shifts a mask silently. A context opened on a
conversation that lost what the session's previous turn had — its tools, its system prompt — or
that answers tool calls it does not hold (a client that left the history to a server that never
kept it) is a ``context_lost`` event and counted (``context_lost_turns``), never a quiet branch.

Budgets (``Budgets``): a per-turn output cap, a prompt budget and a total trajectory budget
that counts observations. Hitting the prompt or trajectory budget ends the session with status
``truncated``; later requests are refused.

Everything a gateway's sessions share — engine, tokenizer functions, chat format, sampling,
default budgets — is one frozen ``GatewaySettings``, fixed when the gateway is built and handed
to each session it opens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlonce.core.records import Context, FailureCategory, Role, Segment
from rlonce.core.timeouts import Expired, within
from rlonce.engine.base import Generation, SamplingParams, Watch
from rlonce.gateway.messages import (
    CallOut,
    ChatRequest,
    ContextLengthExceeded,
    Message,
    ProtocolError,
    Turn,
    token_logprobs,
)
from rlonce.gateway.settings import Budgets, GatewaySettings

GREEDY_BELOW = 1e-3
"""A client temperature below this (0 included) decodes greedily: dividing logits by a tiny
temperature overflows to inf in float32 (``1e-300`` would give NaN probabilities)."""
__all__ = ["Budgets", "GatewaySettings", "Session", "SessionClosed", "session_metrics"]


class SessionClosed(ProtocolError):
    """The session ended (truncated or closed); it takes no more turns."""

    def __init__(self, session_id: str, status: str):
        super().__init__(f"session {session_id!r} has ended ({status}); open a new session",
                         status=409, kind="session_ended")


@dataclass
class Branch:
    """A context and the messages it encodes. ``marks[i]`` is how many of the context's
    segments encode ``messages[:i+1]``; an assistant message's mark ends at its model segment."""

    context: Context
    messages: list[Message]
    marks: list[int]
    tools: list = None
    """The tool schemas rendered into this context's system prompt."""
    turn_open: bool = False
    """The last model turn did not end with the turn-end token (it was cut by a token cap)."""


@dataclass
class _Plan:
    branch: Branch
    new_branch: bool
    keep_segments: int
    keep_messages: int
    delta: Segment | None
    event: dict | None
    prompt_ids: list[int]


class Session:
    def __init__(self, session_id: str, settings: GatewaySettings, *, key: str, budgets: Budgets | None = None,
                 seed: int | None = None, metadata: dict | None = None):
        self.id = session_id
        self.settings = settings
        self.key = key
        """The owner's key: only requests carrying it reach this session over HTTP."""
        self.budgets = budgets or settings.budgets
        self.seed = seed
        self.metadata: dict = dict(metadata or {})
        self.branches: list[Branch] = []
        self.current: Branch | None = None
        """The context the last turn was sampled in."""
        self.events: list[dict] = []
        self.generations: list[Generation] = []
        self.status = "active"
        self.reward: float | None = None
        self.rollback_dropped_tokens = 0
        self.interrupts = 0
        """Turns continued after the engine paused mid-generation (partial rollout)."""
        self.last_used = time.monotonic()
        self.lock = asyncio.Lock()
        self.queued = 0
        """Requests waiting for the turn in flight to end (``GatewaySettings.busy_wait``)."""
        self.prompt_tokens = 0
        """The prompt length of the turn being sampled (or last sampled)."""
        self.responses: dict[str, list[Message]] = {}
        """Responses API: the dialogue after each response id, for ``previous_response_id``."""

    # ---- the record --------------------------------------------------------------------
    @property
    def contexts(self) -> list[Context]:
        return [b.context for b in self.branches]

    def model_tokens(self) -> int:
        return sum(c.model_tokens() for c in self.contexts)

    def flag_last(self, name: str) -> None:
        """Mark the last model turn for the penalty module (e.g. a harness-level format error)."""
        for b in reversed(self.branches):
            for seg in reversed(b.context.segments):
                if seg.role is Role.MODEL:
                    seg.flags[name] = True
                    return

    def last_request(self) -> float | None:
        """When the last request ended (``time.monotonic``), or ``None`` while one is in flight:
        what the agent idle limit watches."""
        return None if self.lock.locked() else self.last_used

    def close(self, status: str = "closed") -> None:
        if self.status == "active":
            self.status = status

    # ---- one request -------------------------------------------------------------------
    def _plan(self, req: ChatRequest) -> _Plan:
        msgs = req.messages
        tools = req.tools if self.settings.render_tools else []
        matched = []
        for b in self.branches:
            if not _same_tools(b.tools, tools):  # the tools are part of the prompt: other tools never match
                continue
            m = 0
            while m < min(len(msgs), len(b.messages)) and msgs[m].same_as(b.messages[m]):
                m += 1
            matched.append((m, b))
        extendable = [(m, b) for m, b in matched if m == len(b.messages)]
        if extendable:  # the longest context the request extends (the latest on ties)
            m, b = max(reversed(extendable), key=lambda x: x[0])
            return self._delta_plan(b, len(b.context.segments), m, msgs, None)
        best_m, best = max(reversed(matched), key=lambda x: x[0]) if matched else (0, None)
        reasoning_rewritten = (best is not None and best_m < min(len(msgs), len(best.messages))
                               and msgs[best_m].differs_only_in_reasoning(best.messages[best_m]))
        if best is not None and not reasoning_rewritten:  # dropped reasoning always branches (seed 001)
            a = max((i for i in range(best_m) if best.messages[i].role == "assistant"), default=None)
            if a is not None:
                keep = best.marks[a]
                dropped = [s for s in best.context.segments[keep:] if s.role is Role.MODEL]
                if len(dropped) <= 1:
                    event = {"kind": "rollback", "context": best.context.label, "at_message": best_m,
                             "dropped_model_tokens": sum(len(s.token_ids) for s in dropped)}
                    return self._delta_plan(best, keep, a + 1, msgs, event)
        # a new context: the whole dialogue becomes its (untrained) prompt
        label = "main" if not self.branches else f"branch-{len(self.branches)}"
        ctx = Context(label=label)
        ids = self.settings.encode(self.settings.fmt.render(msgs, tools))
        event = None if not self.branches else {
            "kind": "branch", "context": label, "from": best.context.label if best else None,
            "diverged_at_message": best_m, "reason": "the request rewrote earlier history"}
        if reasoning_rewritten:
            event["reason"] = "the client dropped or rewrote the model's reasoning"
            event["reasoning_rewritten"] = True
        if event is not None and best is None:  # every context was opened under another tool list
            last = self.current or self.branches[-1]
            event.update({"from": last.context.label, "reason": "the request's tool list differs from the context's",
                          "tools_changed": True})
        branch = Branch(ctx, [], [], tools)
        return _Plan(branch, True, 0, 0, Segment(Role.PROMPT, ids), event, ids)

    def _delta_plan(self, b: Branch, keep_segments: int, keep_messages: int, msgs: list[Message],
                    event: dict | None) -> _Plan:
        new = msgs[keep_messages:]
        turn_open = b.turn_open if keep_segments == len(b.context.segments) else not self._ends_turn(
            b.context.segments[keep_segments - 1])
        ids = self.settings.encode(self.settings.fmt.continuation(new, turn_open=turn_open))
        prefix = [t for s in b.context.segments[:keep_segments] for t in s.token_ids]
        return _Plan(b, False, keep_segments, keep_messages, Segment(Role.OBSERVATION, ids), event, prefix + ids)

    def _ends_turn(self, seg: Segment) -> bool:
        return seg.finish_reason == "stop"

    def _sampling(self, req: ChatRequest, room: int) -> tuple[SamplingParams, bool]:
        cap = self.budgets.max_tokens_per_turn
        want = min(cap, req.max_tokens) if req.max_tokens else cap
        s = replace(self.settings.sampling, max_tokens=max(1, min(want, room)))
        if self.settings.honor_client_sampling:
            if req.temperature is not None and req.temperature < GREEDY_BELOW:  # 0, 1e-300: greedy
                s = replace(s, temperature=1.0, top_k=1)
            elif req.temperature is not None:
                s = replace(s, temperature=req.temperature)
            if req.top_p is not None:  # the engine keeps the top token whatever top_p is
                s = replace(s, top_p=min(1.0, max(req.top_p, GREEDY_BELOW)))
            if req.top_k and s.top_k != 1:  # Anthropic's top_k (0: off), unless greedy already
                s = replace(s, top_k=req.top_k)
        if req.constraint is not None:  # set only where client sampling is honoured (structured.accept)
            s = replace(s, constraint=req.constraint)
        if req.logprobs:  # read after each draw: what is sampled does not change
            s = replace(s, top_logprobs=req.top_logprobs)
        if self.seed is not None:
            s = replace(s, seed=self.seed + 7919 * len(self.generations))
        return s, want > room

    async def turn(self, req: ChatRequest, on_token: Callable[[int], None] | None = None) -> Turn:
        """Plan the request against the contexts, sample one turn, and commit it — or, if the
        engine fails, leave every context exactly as it was. ``on_token`` is called on this
        event loop with each token as the engine samples it (a streamed reply)."""
        if self.status != "active":
            raise SessionClosed(self.id, self.status)
        if not req.messages:
            raise ProtocolError("the request has no messages", param="messages")
        if self.settings.offload is None or _small(req):  # a hop would cost more than rendering a small one
            plan = self._plan(req)
        else:  # render and tokenize on a background thread; nothing else touches this session meanwhile
            plan = await asyncio.get_running_loop().run_in_executor(self.settings.offload, self._plan, req)
        self.prompt_tokens = len(plan.prompt_ids)
        room = self.budgets.max_context - len(plan.prompt_ids)
        prompt_cap = self.budgets.max_prompt or self.budgets.max_context
        if room <= 1 or len(plan.prompt_ids) > prompt_cap:
            if self.settings.context_errors:
                self.events.append({"kind": "context_length_exceeded", "context": plan.branch.context.label,
                                    "prompt_tokens": len(plan.prompt_ids)})
                raise ContextLengthExceeded(len(plan.prompt_ids), min(prompt_cap, self.budgets.max_context - 2))
            self._commit_prompt_only(plan)
            self.status = "truncated"
            self.events.append({"kind": "truncated", "context": plan.branch.context.label,
                                "prompt_tokens": len(plan.prompt_ids)})
            return Turn("", [], "length", len(plan.prompt_ids), 0, self.id, len(self.generations),
                        dialogue=list(req.messages))
        edit = req.edit_trigger
        if edit is not None and len(plan.prompt_ids) >= edit.tokens:  # the real API would rewrite the history here
            self.events.append({"kind": "context_edit_refused", "context": plan.branch.context.label,
                                "field": edit.field, "prompt_tokens": len(plan.prompt_ids)})
            raise ProtocolError(f"{edit.field} would {edit.what} at this prompt's {len(plan.prompt_ids)} tokens (its "
                                f"trigger is {edit.tokens}), and this gateway applies no context edits (it records the "
                                "conversation as sent): shorten the conversation yourself, or raise the trigger",
                                param=edit.field)
        sampling, budget_bound = self._sampling(req, room)
        stops = req.stop if self.settings.honor_client_sampling else ()
        watch = self._watch(on_token, stops) if on_token or stops else None
        try:
            gen = await within(self._generate(plan.prompt_ids, sampling, watch), self.settings.model_timeout,
                               FailureCategory.MODEL_TIMEOUT)
        except Expired:
            self.events.append({"kind": "model_timeout", "context": plan.branch.context.label,
                                "seconds": self.settings.model_timeout})
            raise
        return self._commit(plan, req, gen, budget_bound, sampling.temperature, stops)

    def _watch(self, on_token: Callable[[int], None] | None, stops: tuple[str, ...]) -> Watch:
        """What the engine calls with each token (on its own thread): hand the token to this
        loop for ``on_token``, and end the turn once its text holds one of ``stops``."""
        loop, ids, decode = asyncio.get_running_loop(), [], self.settings.decode
        window = 4 * max((len(x) for x in stops), default=0) + 4  # tokens enough to hold any stop sequence

        def watch(token: int) -> bool:
            ids.append(token)
            if on_token is not None:
                try:
                    loop.call_soon_threadsafe(on_token, token)
                except RuntimeError:  # the loop has closed: nobody is listening any more
                    pass
            return bool(stops) and any(x in decode(ids[-window:]) for x in stops)

        return watch

    async def _generate(self, prompt: list[int], sampling: SamplingParams, watch: Watch | None = None) -> Generation:
        kw = {} if watch is None else {"watch": watch}
        gen = await self.settings.engine.generate(prompt, sampling, **kw)
        while gen.finish_reason == "abort":  # partial rollout: the engine paused for a weight update
            gen = await self._continue(prompt, gen, sampling, kw)
        return gen

    async def _continue(self, prompt: list[int], gen: Generation, sampling: SamplingParams,
                        kw: dict | None = None) -> Generation:
        """Resume an interrupted turn: re-prefill the context plus the tokens sampled so far
        (under whatever weights the engine holds now) and append what follows. Earlier tokens
        keep their log-probs and versions; the turn records the versions it spans."""
        self.interrupts += 1
        left = sampling.max_tokens - len(gen.token_ids)
        if left <= 0:
            return replace(gen, finish_reason="length")
        more_s = replace(sampling, max_tokens=left,
                         seed=None if sampling.seed is None else sampling.seed + 104729 * self.interrupts)
        if sampling.constraint is not None:  # the grammar goes on from where the turn was paused
            more_s = replace(more_s, constraint=replace(sampling.constraint, prefix=tuple(gen.token_ids)))
        more = await self.settings.engine.generate(prompt + gen.token_ids, more_s, **(kw or {}))
        sizes = None if gen.candidates is None and more.candidates is None else (
            (gen.candidates or [0] * len(gen.token_ids)) + (more.candidates or [0] * len(more.token_ids)))
        tops = None if gen.top_logprobs is None and more.top_logprobs is None else (
            (gen.top_logprobs or [[] for _ in gen.token_ids]) + (more.top_logprobs or [[] for _ in more.token_ids]))
        metrics = {**gen.metrics, **more.metrics}
        for k in ("prompt_tokens", "cached_prompt_tokens", "compiled_tokens"):  # both parts count
            if k in gen.metrics or k in more.metrics:
                metrics[k] = gen.metrics.get(k, 0) + more.metrics.get(k, 0)
        return Generation(gen.token_ids + more.token_ids, gen.logprobs + more.logprobs, gen.versions + more.versions,
                          more.finish_reason, metrics, sizes, tops, routes=more.routes)  # ``more`` ran it all

    def _commit_prompt_only(self, plan: _Plan) -> None:
        if plan.new_branch:
            return  # nothing of it was ever sampled from; no context to keep
        b = plan.branch
        b.context.segments[plan.keep_segments:] = [plan.delta] if plan.delta else []
        _keep_routes(b.context, plan)

    def _commit(self, plan: _Plan, req: ChatRequest, gen: Generation, budget_bound: bool, temperature: float,
                stops: tuple[str, ...] = ()) -> Turn:
        previous, b = self.current, plan.branch
        self.current = b
        if plan.new_branch:
            lost = _lost(previous, b, req.messages)
            if lost:
                self.events.append({"kind": "context_lost", "context": b.context.label,
                                    "from": previous.context.label if previous else None, "lost": lost,
                                    "prompt_tokens": len(plan.prompt_ids)})
            self.branches.append(b)
            b.context.segments.append(plan.delta)
            b.messages = list(req.messages)
            b.marks = [1] * len(req.messages)
        else:
            cut = b.context.segments[plan.keep_segments:]
            self.rollback_dropped_tokens += sum(len(s.token_ids) for s in cut if s.role is Role.MODEL)
            del b.context.segments[plan.keep_segments:]
            del b.messages[plan.keep_messages:]
            del b.marks[plan.keep_messages:]
            b.context.segments.append(plan.delta)
            new = req.messages[plan.keep_messages:]
            b.messages += new
            b.marks += [len(b.context.segments)] * len(new)
        if plan.event:
            self.events.append(plan.event)
        if gen.routes is not None:  # it ran the whole prompt: the routing of every position as it now stands
            b.context.routes = gen.routes
        else:
            _keep_routes(b.context, plan)
        seg = Segment(Role.MODEL, list(gen.token_ids), list(gen.logprobs), list(gen.versions), gen.finish_reason,
                      candidates=None if gen.candidates is None else list(gen.candidates), temperature=temperature,
                      forced=gen.forced)
        b.context.segments.append(seg)
        self.generations.append(gen)
        text, stopped = self.settings.decode(gen.token_ids), None
        found = [(text.find(x), x) for x in stops if x in text] if gen.finish_reason == "stop_sequence" else []
        if found:  # the content ends before the first stop sequence
            at, stopped = min(found)
            text = text[:at]
        known = {t["name"] for t in req.tools} if req.tools and req.structure.tool_choice != "none" else None
        reasoning, text = self.settings.fmt.split_reasoning(text)
        content, calls, flag = self.settings.fmt.split_turn(text, known)
        if flag:
            seg.flags[flag] = True
        b.messages.append(Message("assistant", content, tuple(calls), reasoning=reasoning))
        b.marks.append(len(b.context.segments))
        b.turn_open = gen.finish_reason != "stop"
        n = len(self.generations) - 1
        outs = [CallOut(f"call_{n}_{i}", c.name, c.arguments) for i, c in enumerate(calls)]
        finish = "length" if gen.finish_reason in ("length", "repetition") else ("tool_calls" if outs else "stop")
        if gen.finish_reason == "length" and budget_bound and not self.settings.context_errors:
            self.status = "truncated"
            self.events.append({"kind": "truncated", "context": b.context.label, "reason": "trajectory budget"})
        dialogue = list(b.messages if gen.token_ids else req.messages)
        thought = self.settings.fmt.reasoning_length(gen.token_ids, self.settings.decode) if reasoning else 0
        lps = token_logprobs(gen, self.settings.decode, req.top_logprobs) if req.logprobs else None
        return Turn(content, outs, finish, len(plan.prompt_ids), len(gen.token_ids), self.id, n, stopped, reasoning,
                    dialogue, thought, lps)

    # ---- export ------------------------------------------------------------------------
    def export(self) -> dict:
        """The trajectory: every context's segments with ids, log-probs, versions, candidate-set
        sizes (top-k/top-p; null when nothing cut the distribution), the temperature a model segment
        was sampled at (null on other segments) and flags."""
        return {
            "session_id": self.id,
            "status": self.status,
            "reward": self.reward,
            "events": list(self.events),
            "metadata": dict(self.metadata),
            "contexts": [{
                "label": b.context.label,
                "messages": len(b.messages),
                "segments": [{"role": s.role.value, "token_ids": s.token_ids, "logprobs": s.logprobs,
                              "versions": s.versions, "candidates": s.candidates, "finish_reason": s.finish_reason,
                              "temperature": s.temperature if s.role is Role.MODEL else None,
                              "flags": dict(s.flags), "text": self.settings.decode(s.token_ids)}
                             for s in b.context.segments],
            } for b in self.branches],
        }


def _keep_routes(ctx: Context, plan: _Plan) -> None:
    """Cut a context's recorded routing (R3) to the tokens the plan kept before its new ones."""
    if ctx.routes is not None:
        kept = 0 if plan.new_branch else len(plan.prompt_ids) - (len(plan.delta.token_ids) if plan.delta else 0)
        ctx.routes = ctx.routes[:kept] if kept else None


def _lost(previous: Branch | None, opened: Branch, msgs: list[Message]) -> list[str]:
    """What a newly opened context lacks: ``tools`` and ``system`` that the context of the session's
    previous turn had, ``tool_calls`` when it holds tool results whose calls are not in it."""
    lost = []
    if previous is not None:
        if previous.tools and not opened.tools:
            lost.append("tools")
        if previous.messages and previous.messages[0].role == "system" and msgs[0].role != "system":
            lost.append("system")
    called = False
    for m in msgs:
        if m.role == "tool" and not called:
            lost.append("tool_calls")
            break
        if m.role != "tool":
            called = m.role == "assistant" and bool(m.tool_calls)
    return lost


def _same_tools(a: list | None, b: list | None) -> bool:
    """The same tool schemas, in whatever order the client lists them."""
    def key(tools):
        return sorted(json.dumps(t, sort_keys=True) for t in tools or [])
    return a == b or key(a) == key(b)


INLINE_CHARS = 8 << 10
"""A request whose messages and tools hold fewer characters than this is planned (rendered and
tokenized) on the event loop: well under a millisecond, less than the executor hop costs."""


def _small(req: ChatRequest) -> bool:
    n = sum(len(m.content) + len(m.reasoning) + 64 * len(m.tool_calls) for m in req.messages)
    return n + 256 * len(req.tools) < INLINE_CHARS


def session_metrics(s: Session) -> dict[str, float]:
    kinds = [e["kind"] for e in s.events]
    return {"contexts": float(len(s.branches)), "rollbacks": float(kinds.count("rollback")),
            "branches": float(kinds.count("branch")), "rollback_dropped_tokens": float(s.rollback_dropped_tokens),
            "tool_schema_branches": float(sum(1 for e in s.events if e.get("tools_changed"))),
            "reasoning_branches": float(sum(1 for e in s.events if e.get("reasoning_rewritten"))),
            "context_lost_turns": float(kinds.count("context_lost")),
            "interrupts": float(s.interrupts),
            "prompt_tokens": float(sum(g.metrics.get("prompt_tokens", 0) for g in s.generations)),
            "cached_prompt_tokens": float(sum(g.metrics.get("cached_prompt_tokens", 0) for g in s.generations)),
            "sampled_tokens": float(sum(len(g.token_ids) for g in s.generations)),  # rolled-back turns too
            "compiled_tokens": float(sum(g.metrics.get("compiled_tokens", 0) for g in s.generations))}
