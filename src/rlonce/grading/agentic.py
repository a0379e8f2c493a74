"""Agentic graders: a judge that works on a question as an agent in a sandbox, then submits a verdict.

GAR's grader (seed 001) is "an SFT-trained agentic grader" that inspects a mixed-outcome group "in
a shared workspace" and "can inspect the repository and run tests". ``AgenticJudge`` wraps any
``Judge``: a question that names a workspace (``files``) becomes one agent episode through the
harness's own loop and arms (``rlonce.harness.loop.run_episode``), in a bubblewrap sandbox at
``/work`` holding the task's files and every sibling's change side by side (``attempts/<i>.diff``);
for a task that lays out its own workspace (``rlonce.envs.base.HasCheckout``: the code domain's
buggy repository, with its testbed mounted so ``python3 -m pytest`` runs inside) the sandbox is
that workspace. The agent has bash and ``submit``, whose ``answer`` is the verdict's schema; an
endpoint agent is asked for a tool call every turn and for ``submit`` on the last
(``rlonce.grading.structure``), and one that refuses ``tool_choice`` is asked without it for the
rest of the episode, counted ``unstructured``. Its submitted answer is parsed like any judge's
reply. A question without a workspace goes to the wrapped judge as is.

Where it departs from the paper: no grader is trained here. An endpoint judge's model is the
agent (its wire protocol picks the arm); a scripted judge becomes a scripted agent — it lists and
prints the attempts (and runs the workspace's own check, a code task's tests), then submits the scripted judge's
answer — so tests and CPU runs go through the whole path with known verdicts.

Failures follow ``rlonce.grading.judge``: never an exception for what the model or the endpoint
does. No submission within the turns, or a turn without a usable tool call: ``invalid``; a
submitted answer that is not the schema: ``non_json``/``invalid``; the endpoint's own failures keep
their category; the episode past ``timeout * max_turns`` seconds: ``timeout``; a sandbox that
cannot be built or run: ``down`` (infrastructure). Transport failures (``down``, ``http_error``)
are retried like a plain judge's; a model failure is the verdict and is not.

The sandbox protects the host from the grader's commands (and from the attempts' code the tests
run) exactly as a rollout sandbox does (``rlonce.sandbox.bwrap``); it holds copies only, and is
removed after the episode. It does not keep the grader from being misled by what an attempt
prints when its code runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq

from pydantic import BaseModel

from rlonce.core.records import Grade, Sequence
from rlonce.envs.base import Checkout, GradingError, HasCheckout
from rlonce.envs.workspace import BASH_TOOL, BASH_USAGE, SUBMIT_TOOL, bash_command, run_bash
from rlonce.grading.judge import Completion, Image, Judge, JudgeFailed, Verdict, parse_verdict
from rlonce.grading.structure import refuses_structure, submit_tool, tool_choice
from rlonce.harness.arms import Arm, get_arm
from rlonce.harness.base import FormatError, LimitsExceeded, Submitted
from rlonce.harness.clients import CLIENTS, Reply, Send
from rlonce.harness.loop import HarnessLimits, run_episode
from rlonce.sandbox.base import Sandbox, SandboxError
from rlonce.sandbox.bwrap import BwrapSandbox

SYSTEM_PROMPT = ("You are a grader working in a sandbox. /work holds the task and the attempts to grade (each "
                 "attempt's change as attempts/<id>.diff){repo}. Inspect them with bash: read files, apply a diff "
                 "to a copy, run the tests. Change nothing you are grading. Then submit your verdict: "
                 "submit(answer=...) with the verdict as one JSON object in the requested schema.")
SCRIPTED_LOOK = "ls -R /work/attempts; cat /work/attempts/*"
"""The scripted agent's first command: list and print every attempt (then the checkout's ``check``)."""
RETRIED = ("down", "http_error")
LINE_CHARS = 4000
"""Characters of one model turn or observation kept in the transcript."""
DEFAULT_ARMS = {"anthropic": "mini-claude-code"}
"""The arm whose wire protocol an endpoint judge speaks (others: ``mini-bash``, Chat Completions)."""
ENDPOINT_PROTOCOLS = {"openai": "openai-chat", "anthropic": "anthropic-messages"}


class GraderWorkspace:
    """The Environment of one grading episode: a sandbox holding ``files`` (relative path → text)
    and, for a task with a checkout (``HasCheckout``), the task's own workspace; bash and submit.
    It is never graded."""

    def __init__(self, task, files: dict[str, str], prompt: str):
        self.task, self.files, self.prompt = task, dict(files), prompt
        self.checkout: Checkout | None = task.checkout() if isinstance(task, HasCheckout) else None
        self.sandbox: Sandbox | None = None
        self.metrics: dict[str, float] = {}

    def _build(self) -> Sandbox:
        sbx = self.checkout.sandbox() if self.checkout is not None else BwrapSandbox()
        try:
            for path, text in self.files.items():
                sbx.put_file(path, text)
        except BaseException:
            sbx.close()
            raise
        return sbx

    async def setup(self) -> None:
        self.sandbox = await asyncio.to_thread(self._build)

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(repo=f", {self.checkout.note}" if self.checkout is not None else "")

    def user_prompt(self) -> str:
        return f"{self.prompt}\n\nFiles in /work: {', '.join(sorted(self.files))}"

    def tools(self) -> list[dict]:
        return [BASH_TOOL, SUBMIT_TOOL]

    async def call_tool(self, name: str, arguments: dict) -> str:
        if name != "bash":
            raise KeyError(name)
        assert self.sandbox is not None, "setup() was not called"
        command = bash_command(arguments)
        return BASH_USAGE if command is None else await run_bash(self.sandbox, command)

    async def grade(self, sequence: Sequence) -> Grade:
        raise GradingError("a grader's workspace is not graded")

    async def cleanup(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()


def _line(text: str) -> str:
    text = text.strip()
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS] + f" [... {len(text) - LINE_CHARS} chars cut]"


class _Logged:
    """A wire-protocol client around the arm's own: keeps the episode's transcript and token counts,
    takes a submitted verdict object for its JSON text, and turns a reply the harness cannot use
    into the loop's ``FormatError`` (bad tool arguments, an unknown tool) or
    ``JudgeFailed('http_error')`` (a body that is not the protocol's). With ``last_turn`` (an
    endpoint's episode) each request asks for a tool call, the last turn's for ``submit``, until
    the endpoint refuses ``tool_choice`` (``structured`` turns False)."""

    def __init__(self, protocol: str, send: Send, last_turn: int | None = None):
        self.protocol, self._send, self.last_turn = protocol, send, last_turn
        self.structured: bool | None = True if last_turn is not None else None
        self.client = None
        self.tools: set[str] = set()
        self.lines: list[str] = []
        self.turns = self.tokens_in = self.tokens_out = 0

    async def _choose(self, protocol: str, body: dict) -> dict:
        if not self.structured:
            return await self._send(protocol, body)
        choice = tool_choice(protocol, "submit" if self.turns >= self.last_turn else None)
        try:
            return await self._send(protocol, {**body, "tool_choice": choice})
        except JudgeFailed as e:
            if not refuses_structure(e.status, e.detail):
                raise
        self.structured = False
        self.lines.append(f"[turn {self.turns}] the endpoint refused tool_choice: asking without it")
        return await self._send(protocol, body)

    async def send(self, protocol: str, body: dict) -> dict:
        r = await self._choose(protocol, body)
        u = r.get("usage") if isinstance(r, dict) else None
        if isinstance(u, dict):
            try:
                self.tokens_in += int(u.get("prompt_tokens", u.get("input_tokens", 0)) or 0)
                self.tokens_out += int(u.get("completion_tokens", u.get("output_tokens", 0)) or 0)
            except (TypeError, ValueError):
                pass
        return r

    async def ask(self) -> Reply:
        self.turns += 1
        try:
            reply = await self.client.ask()
        except json.JSONDecodeError as e:
            raise FormatError(f"a tool call's arguments are not JSON: {e}") from None
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise JudgeFailed("http_error", f"the reply is not a {self.protocol} reply: {e!r}") from None
        if reply.text.strip():
            self.lines.append(f"[turn {self.turns}] {_line(reply.text)}")
        for _, name, args in reply.calls:
            if name == "submit" and isinstance(args, dict) and isinstance(args.get("answer"), dict):
                args["answer"] = json.dumps(args["answer"])  # the verdict object itself, not its text
            self.lines.append(f"[turn {self.turns}] call {name} {_line(json.dumps(args))}")
            if not isinstance(args, dict) or name not in self.tools:
                raise FormatError(f"unusable tool call {name!r}: an unknown tool or arguments not an object")
        return reply

    def give(self, results: list[tuple[str, str]]) -> None:
        self.lines += [f"[turn {self.turns}] observation:\n{_line(text)}" for _, text in results]
        self.client.give(results)

    def restart(self, user: str) -> None:
        self.lines.append(f"[turn {self.turns}] the context was compacted")
        self.client.restart(user)

    def say(self, user: str) -> None:
        self.lines.append(f"[turn {self.turns}] {_line(user)}")
        self.client.say(user)

    def text(self) -> str:
        return "\n".join(self.lines)


def _call_reply(protocol: str, turn: int, text: str, call: tuple[str, dict] | None, n_in: int, n_out: int) -> dict:
    """A reply body of ``protocol`` holding ``text`` and at most one tool call."""
    cid = f"call_{turn}"
    if protocol == "anthropic-messages":
        content = [{"type": "text", "text": text}] if text else []
        if call:
            content.append({"type": "tool_use", "id": cid, "name": call[0], "input": call[1]})
        return {"content": content, "stop_reason": "tool_use" if call else "end_turn",
                "usage": {"input_tokens": n_in, "output_tokens": n_out}}
    if protocol == "openai-responses":
        out = [{"type": "message", "content": [{"type": "output_text", "text": text}]}] if text else []
        if call:
            out.append({"type": "function_call", "call_id": cid, "name": call[0], "arguments": json.dumps(call[1])})
        return {"id": f"resp_{turn}", "output": out, "status": "completed",
                "usage": {"input_tokens": n_in, "output_tokens": n_out}}
    msg: dict = {"role": "assistant", "content": text or None}
    if call:
        msg["tool_calls"] = [{"id": cid, "type": "function",
                              "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
    return {"choices": [{"message": msg, "finish_reason": "tool_calls" if call else "stop"}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out}}


def scripted_agent(answer: Callable[[], object], command: str) -> Send:
    """A deterministic model speaking whichever protocol it is sent: on its first turn it runs
    ``command`` with the arm's shell tool (``bash``, ``Bash`` or ``exec_command``), then submits
    ``answer()`` (text, or an awaitable of it). An arm without tools gets the answer as its reply."""
    turn = 0

    async def send(protocol: str, body: dict) -> dict:
        nonlocal turn
        turn += 1
        schemas = [t.get("function", t) for t in body.get("tools") or []]
        shell = next((s for s in schemas if s["name"] in ("bash", "Bash", "exec_command")), None)
        n_in = len(json.dumps(body).split())
        if turn == 1 and shell is not None:
            key = (shell.get("parameters") or shell.get("input_schema"))["required"][0]
            return _call_reply(protocol, turn, "", (shell["name"], {key: command}), n_in, len(command.split()))
        out = answer()
        text = await out if asyncio.iscoroutine(out) else out
        call = ("submit", {"answer": text}) if any(s["name"] == "submit" for s in schemas) else None
        return _call_reply(protocol, turn, "" if call else text, call, n_in, len(text.split()))

    return send


class AgenticJudge(Judge):
    """``inner``'s model (or script) as an agent in the task's workspace; see the module docstring.
    ``arm`` is the harness arm it works through (default: the one speaking the endpoint's
    protocol, ``mini-bash`` for Chat Completions and scripts). Calls are recorded to ``inner``'s
    record; ``take_counts`` gives both judges' counts together."""

    def __init__(self, inner: Judge, *, arm: str | None = None, max_turns: int = 8, max_obs_chars: int = 2000,
                 max_context: int = 8192):
        if isinstance(inner, AgenticJudge):
            raise ValueError("an AgenticJudge wraps a plain judge, not another AgenticJudge")
        protocol = getattr(inner, "protocol", None)
        self.arm: Arm = get_arm(arm or DEFAULT_ARMS.get(protocol, "mini-bash"))
        if hasattr(inner, "send") and self.arm.protocol != ENDPOINT_PROTOCOLS.get(protocol):
            raise ValueError(f"arm {self.arm.name!r} speaks {self.arm.protocol}, the judge's endpoint {protocol}")
        if not hasattr(inner, "send") and not hasattr(inner, "script"):
            raise ValueError(f"{type(inner).__name__} has neither an endpoint (send) nor a script to act as an agent")
        super().__init__(inner.name, inner.model, retries=inner.retries, timeout=inner.timeout, record=inner.record)
        self.inner = inner
        self.limit = inner.limit
        self.max_turns, self.max_obs_chars, self.max_context = max_turns, max_obs_chars, max_context

    async def complete(self, prompt: str, sample: int, kind: str, images: Seq[Image] = (),
                       schema: type[BaseModel] | None = None) -> Completion:
        """A question without a workspace: the wrapped judge's answer."""
        return await self.inner.complete(prompt, sample, kind, images, schema)

    async def ask(self, prompt: str, schema: type[BaseModel], *, kind: str, sample: int = 0, task=None,
                  files: dict[str, str] | None = None, images=()) -> Verdict:
        """A plain question (no ``files``; ``images`` go with it) to ``inner``; else one agent episode
        over ``files``."""
        if files is None:
            return await self.inner.ask(prompt, schema, kind=kind, sample=sample, images=images)
        where = json.dumps([getattr(task, "task_id", None), sorted(files.items())])
        key = hashlib.sha256(f"{self.model}\0{schema.__name__}\0{sample}\0{prompt}\0{where}".encode()).hexdigest()
        if key in self.cache:
            self.counts["cached"] += 1
            hit = self.cache[key]
            return Verdict(hit.value, hit.outcome, cached=True)
        async with self.limit:
            v, text, turns = await self._attempts(prompt, schema, kind, sample, task, files)
        self.counts.update({"calls": 1, v.outcome: 1, "tokens_in": v.tokens_in, "tokens_out": v.tokens_out,
                            "agent_turns": turns})
        self.counts["seconds"] += v.seconds
        if v.structured is False:
            self.counts["unstructured"] += 1
        if v.ok:
            self.cache[key] = v
        self._write(kind, prompt, text, v, sample)
        return v

    async def _attempts(self, prompt: str, schema: type[BaseModel], kind: str, sample: int, task,
                        files: dict[str, str]) -> tuple[Verdict, str, int]:
        t0, tin, tout, turns = time.perf_counter(), 0, 0, 0
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.25 * 2 ** attempt, 4.0))
            value, outcome, log = await self._episode(prompt, schema, kind, sample, task, files)
            tin, tout, turns = tin + log.tokens_in, tout + log.tokens_out, turns + log.turns
            if outcome not in RETRIED:
                break
        return (Verdict(value, outcome, time.perf_counter() - t0, tin, tout, structured=log.structured),
                log.text(), turns)

    def _transport(self, kind: str, prompt: str, sample: int, checkout: Checkout | None) -> Send:
        send = getattr(self.inner, "send", None)
        if send is None:
            check = checkout.check if checkout is not None else ""
            script, command = self.inner.script, SCRIPTED_LOOK + (f"; {check}" if check else "")
            return scripted_agent(lambda: script(kind, prompt, sample), command)
        extra = {"temperature": getattr(self.inner, "temperature", 0.0)}

        async def endpoint(protocol: str, body: dict) -> dict:
            return await send(protocol, {**body, **extra, **({"seed": sample} if protocol == "openai-chat" else {})})

        return endpoint

    async def _episode(self, prompt: str, schema: type[BaseModel], kind: str, sample: int, task,
                       files: dict[str, str]) -> tuple[BaseModel | None, str, _Logged]:
        """One episode: (verdict or None, outcome, the logged client holding the transcript)."""
        env = GraderWorkspace(task, files, prompt)
        endpoint = hasattr(self.inner, "send")
        log = _Logged(self.arm.protocol, self._transport(kind, prompt, sample, env.checkout),
                      self.max_turns if endpoint else None)
        value, outcome, why = None, "ok", ""
        try:
            await env.setup()
            tools = self.arm.toolset(env)
            log.tools = set(tools)
            schemas = [submit_tool(schema) if name == "submit" else t.schema for name, t in tools.items()]
            log.client = CLIENTS[self.arm.protocol](log.send, self.arm.system_prompt(env), env.user_prompt(), schemas)
            limits = HarnessLimits(max_turns=self.max_turns, max_obs_chars=self.max_obs_chars)
            await asyncio.wait_for(run_episode(self.arm, env, log, None, limits, self.max_context),
                                   self.timeout * self.max_turns)
        except Submitted as end:
            try:
                value = parse_verdict(end.answer, schema)
            except JudgeFailed as e:
                outcome, why = e.category, str(e)
            else:
                why = "submitted a verdict"
        except (LimitsExceeded, FormatError) as e:
            outcome, why = "invalid", str(e)
        except JudgeFailed as e:
            outcome, why = e.category, str(e)
        except asyncio.TimeoutError:  # before OSError: TimeoutError is one
            outcome, why = "timeout", f"no verdict within {self.timeout * self.max_turns:g} s"
        except (SandboxError, OSError) as e:
            outcome, why = "down", f"the grader's sandbox failed: {e}"
        finally:
            await env.cleanup()
        log.lines.append(f"[end] {outcome}: {why}")
        return value, outcome, log

    def take_counts(self) -> dict[str, float]:
        """This judge's counts and ``inner``'s (the questions without a workspace), summed; then zero both."""
        out = self.inner.take_counts()
        for k, v in super().take_counts().items():
            out[k] = out.get(k, 0.0) + v
        return out
