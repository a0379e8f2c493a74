"""Chat formats: how a dialogue becomes text, one delta at a time, and how tool calls are parsed.

A chat format renders the *increments* of a dialogue (the opening prompt, one observation,
the generation prompt) so that a session can append tokens without ever re-encoding what the
model already sampled. The same strings are what the model folder's Jinja chat template
renders for the whole dialogue; ``tests/unit/test_chat.py`` checks that the two agree, which is
what keeps training tokens identical to sampled tokens.

Formats are looked up by name (``FORMATS``). ``hermes`` is the Qwen/Hermes style used by the
embedded model: ``<tool_call>{json}</tool_call>`` inside an assistant turn, tool results as
``<tool_response>`` blocks in a user turn. ``smollm2`` is the markup SmolLM2-Instruct was tuned
on for function calling: the same ChatML turns, the tools listed in ``<tools>`` under its
instruction text, and one ``<tool_call>[...]</tool_call>`` block holding a JSON *list* of calls.

``ChatFormat`` is what the gateway and the harnesses ask of a format; both formats here are
ChatML underneath and share that markup through ``_ChatML``, each adding its own tool markup.

A format also writes the grammars of structured output in its own markup (``call_grammar``: a
turn that is one call of given tools, exactly as ``parse_tool_calls`` reads it back;
``no_call_grammar``: a turn without a call). They are Lark grammars in llguidance's dialect, the
arguments an inline ``%json`` schema; the engine enforces them token by token
(``rlonce.engine.constrain``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol


class ToolCallParseError(ValueError):
    """The model's text holds no well-formed tool call."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def tool_json(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def _encodable(value) -> bool:
    """Whether every string in ``value`` (a call's decoded JSON arguments) is valid Unicode."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ChatFormat(Protocol):
    """How a dialogue becomes text and a sampled turn becomes content and tool calls: what the
    gateway's sessions (``render``, ``continuation``, ``split_turn``) and the scripted and expert
    turns of the harnesses (``assistant_text``) use. ``FORMATS`` holds the implementations."""

    @property
    def name(self) -> str: ...

    @property
    def turn_end(self) -> str:
        """The text that ends a model turn (its token is one of the engine's stop tokens)."""

    def render(self, messages, tools: list[dict], *, generation_prompt: bool = True, whole: bool = True) -> str:
        """A whole dialogue of ``Message``s as the model folder's chat template renders it."""

    def continuation(self, messages, *, turn_open: bool) -> str:
        """New messages after a recorded model turn, up to the reopened assistant turn."""

    def assistant_text(self, content: str, calls: list[ToolCall]) -> str:
        """What the model emits for one turn, up to and including ``turn_end``."""

    def split_turn(self, text: str, known: set[str] | None) -> tuple[str, list[ToolCall], str | None]:
        """A sampled turn as (content, tool calls, flag naming a malformed or unknown call)."""

    @property
    def reasoning_tags(self) -> tuple[str, str]:
        """The markup that opens and closes a turn's reasoning."""

    @property
    def stream_holds(self) -> tuple[str, ...]:
        """Markers a streamed reply must not show as content (tool-call markup, the turn end, reasoning)."""

    def split_reasoning(self, text: str) -> tuple[str, str]:
        """A sampled turn as (reasoning, the rest): the text inside the format's reasoning
        markup when the turn opens with it, else ("", text)."""

    def reasoning_length(self, ids: list[int], decode) -> int:
        """How many of a reasoning turn's sampled ``ids`` its reasoning took, markup included."""

    @property
    def call_markup(self) -> tuple[str, ...]:
        """The tags of the format's tool-call markup (what a tokenizer may hold as special tokens)."""

    def call_grammar(self, tools: list[dict], *, special: frozenset[str] = frozenset(), lenient: bool = False,
                     rule: str = "start") -> str:
        """A grammar for a turn that is exactly one call of one of ``tools`` (``{"name", "parameters"}``)
        with arguments valid against the tool's parameters schema, in this format's markup; ``rule``
        names its top rule (another grammar may embed it)."""

    def no_call_grammar(self, *, special: frozenset[str] = frozenset()) -> str:
        """A grammar for a turn of text that holds no tool call."""


CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How a constrained call's JSON is spaced (llguidance's ``x-guidance`` options): as ``tool_json``
writes it, which is how the formats' examples and the models' tool-calling data write calls."""


def _lark_terminal(text: str, special: frozenset[str]) -> str:
    """``text`` in a grammar: a special-token reference (``<tool_call>``) when the tokenizer holds
    it as one added token (llguidance matches no text against those), else a string literal."""
    return text if text in special else json.dumps(text)


def _call_schema(tool: dict, at: str) -> dict:
    """The JSON schema of one call of ``tool``, ``{"name": <its name>, "arguments": <its
    parameters>}``, its local ``$ref``s pointed at where the parameters now sit (``at``)."""
    params = _moved_refs(tool.get("parameters") or {"type": "object", "properties": {}}, at + "/properties/arguments")
    return {"type": "object", "properties": {"name": {"const": tool["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def _moved_refs(value, base: str):
    """``value`` with every local ``$ref`` (``#/...``) re-rooted under the JSON pointer ``base``."""
    if isinstance(value, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _moved_refs(v, base))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_moved_refs(v, base) for v in value]
    return value


class _ChatML:
    """ChatML turns (``<|im_start|>role ... <|im_end|>``) and ``<tool_call>`` blocks, shared by
    the formats below; each supplies ``tools_block``, ``assistant_text``, ``preamble`` and
    ``_block_calls`` (how its tools are listed, its calls written and read back)."""

    reasoning_tags = ("<think>", "</think>")
    """The reasoning markup (Qwen3/DeepSeek-R1 style): a turn that opens with ``<think>`` reasons
    until ``</think>``; the gateway returns that part as reasoning, not content."""

    @property
    def stream_holds(self) -> tuple[str, ...]:
        return ("<tool_call>", self.turn_end, self.reasoning_tags[0])

    def reasoning_length(self, ids: list[int], decode) -> int:
        """The shortest prefix of ``ids`` whose text holds the closing markup (all of them when the
        reasoning never closed): a prefix holds it from some length on, so bisect for that length."""
        end = self.reasoning_tags[1]
        if end not in decode(ids):
            return len(ids)
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if end in decode(ids[:mid]) else (mid + 1, hi)
        return lo

    def split_reasoning(self, text: str) -> tuple[str, str]:
        start, end = self.reasoning_tags
        head = text.lstrip()
        if not head.startswith(start):
            return "", text
        body, sep, rest = head[len(start):].partition(end)
        if not sep:  # never closed (cut by the token cap): all of it is reasoning
            return body.removesuffix(self.turn_end).strip(), self.turn_end if body.endswith(self.turn_end) else ""
        return body.strip(), rest

    def reasoning_text(self, reasoning: str) -> str:
        """How reasoning is written back before a turn's content (a new context's prompt)."""
        start, end = self.reasoning_tags
        return f"{start}\n{reasoning}\n{end}\n\n" if reasoning else ""

    def opening(self, system: str, user: str, tools: list[dict]) -> str:
        """System and first user message, followed by the generation prompt."""
        sys_text = system + (self.tools_block(tools) if tools else "")
        return (
            f"<|im_start|>system\n{sys_text}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n" + self.generation_prompt()
        )

    def generation_prompt(self) -> str:
        return "<|im_start|>assistant\n"

    def observation(self, results: list[str]) -> str:
        """Tool results after a model turn: closes the turn's line, then reopens the assistant."""
        body = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
        return f"\n<|im_start|>user\n{body}<|im_end|>\n" + self.generation_prompt()

    def user_turn(self, text: str) -> str:
        return f"\n<|im_start|>user\n{text}<|im_end|>\n" + self.generation_prompt()

    def render(self, messages, tools: list[dict], *, generation_prompt: bool = True, whole: bool = True) -> str:
        """A whole dialogue of ``Message``s, as the model folder's chat template renders it
        (``whole=False``: a continuation, without the template's preamble).

        The tools are listed once: in the dialogue's leading system message, or — when the
        dialogue does not open with one — in a system turn the preamble puts first. System
        messages later in the dialogue (agent CLIs' reminders) are system turns where they stand.
        An assistant message's reasoning is written back in the format's reasoning markup (a
        chat template that has no reasoning field leaves it out: the re-rendering report then
        shows the difference).

        Used where exact tokens cannot be kept (a new context after the client rewrote its
        history) and by the re-rendering report; live sessions append deltas instead.
        """
        out = [self.preamble(messages, tools)] if whole else []
        for i, m in enumerate(messages):
            if m.role == "system":  # the tools go with the leading system message only
                block = self.tools_block(tools) if tools and i == 0 else ""
                out.append(f"<|im_start|>system\n{m.content}{block}<|im_end|>\n")
            elif m.role == "user":
                out.append(f"<|im_start|>user\n{m.content}<|im_end|>\n")
            elif m.role == "assistant":
                out.append("<|im_start|>assistant\n" + self.reasoning_text(getattr(m, "reasoning", ""))
                           + self.assistant_text(m.content, list(m.tool_calls)) + "\n")
            elif m.role == "tool":
                first = i == 0 or messages[i - 1].role != "tool"
                last = i == len(messages) - 1 or messages[i + 1].role != "tool"
                out.append(("<|im_start|>user\n" if first else "\n") + f"<tool_response>\n{m.content}\n</tool_response>"
                           + ("<|im_end|>\n" if last else ""))
            else:
                raise ValueError(f"unknown message role {m.role!r}")
        return "".join(out) + (self.generation_prompt() if generation_prompt else "")

    def continuation(self, messages, *, turn_open: bool) -> str:
        """New messages after a recorded model turn: closes that turn (its end marker when the
        model did not emit one), renders them, and reopens the assistant."""
        return (self.turn_end if turn_open else "") + "\n" + self.render(messages, [], whole=False)

    def split_turn(self, text: str, known: set[str] | None) -> tuple[str, list[ToolCall], str | None]:
        """A sampled turn as (content, tool calls, flag). With a malformed call, or a call of a
        tool not in ``known``, the whole text is content and the flag names the problem; with
        ``known=None`` (no tools offered) tool-call markup is plain content."""
        body = text.removesuffix(self.turn_end)
        if known is None or "<tool_call>" not in body:
            return body.strip(), [], None
        try:
            blocks = self._blocks(body)
        except ToolCallParseError:
            return body.strip(), [], "malformed_tool_call"
        calls = [c for _, _, block in blocks for c in block]
        if any(not _encodable(c.arguments) for c in calls):  # a lone \\udXXX escape: no client could send it back
            return body.strip(), [], "malformed_tool_call"
        if any(c.name not in known for c in calls):
            return body.strip(), [], "unknown_tool"
        ends, starts = [0] + [end for _, end, _ in blocks], [start for start, _, _ in blocks] + [len(body)]
        return "".join(body[a:b] for a, b in zip(ends, starts)).strip(), calls, None

    call_markup = ("<tool_call>", "</tool_call>")

    def call_grammar(self, tools: list[dict], *, special: frozenset[str] = frozenset(), lenient: bool = False,
                     rule: str = "start") -> str:
        """One ``<tool_call>`` block holding one call of one of ``tools``, written as
        ``assistant_text`` writes it (the format's ``call_frame`` around the call's JSON), then the
        turn's end. ``special``: the tags the tokenizer holds as special tokens; ``lenient``:
        schema keywords llguidance does not implement are ignored (a tool not marked strict)."""
        if not tools:
            raise ValueError("a forced tool call needs at least one tool")
        opening, closing = self.call_markup
        head, tail = self.call_frame
        schema = {"x-guidance": {**CALL_JSON, **({"lenient": True} if lenient else {})},
                  "anyOf": [_call_schema(t, f"#/anyOf/{i}") for i, t in enumerate(tools)]}
        return (f"{rule}: {_lark_terminal(opening, special)} {json.dumps(head)} {rule}_json {json.dumps(tail)} "
                f"{_lark_terminal(closing, special)}\n{rule}_json: %json {json.dumps(schema, ensure_ascii=False)}")

    def no_call_grammar(self, *, special: frozenset[str] = frozenset()) -> str:
        """Any text without the opening tag (a special token cannot be matched as text: it is out too)."""
        opening = re.sub(r"([\\.+*?()|\[\]{}^$#&~-])", r"\\\1", self.call_markup[0])
        return f"start: TEXT\nTEXT: /(?s:.*)/ & ~/(?s:.*){opening}(?s:.*)/"

    def parse_tool_calls(self, text: str) -> list[ToolCall]:
        """Every ``<tool_call>`` block in ``text``; raises ``ToolCallParseError`` on bad markup."""
        return [c for _, _, calls in self._blocks(text.removesuffix(self.turn_end)) for c in calls]

    def _blocks(self, text: str) -> list[tuple[int, int, list[ToolCall]]]:
        """Each ``<tool_call>`` block of ``text``: its span and its calls. The JSON is read as JSON
        (not up to the first closing tag): an argument string may hold ``</tool_call>`` itself."""
        opening, closing = self.call_markup
        decoder, out, pos = json.JSONDecoder(), [], 0
        while (start := text.find(opening, pos)) >= 0:
            at = start + len(opening)
            at += len(text[at:]) - len(text[at:].lstrip())
            try:
                obj, after = decoder.raw_decode(text, at)
            except json.JSONDecodeError as e:
                raise ToolCallParseError(f"tool call is not valid JSON: {e.msg}") from None
            rest = text[after:].lstrip()
            if not rest.startswith(closing):
                raise ToolCallParseError(f"a tool call's JSON is not followed by {closing}")
            pos = len(text) - len(rest) + len(closing)
            out.append((start, pos, [_call_of(item) for item in self._block_calls(obj)]))
        if not out:
            raise ToolCallParseError(f"no {opening} block in the model's turn")
        return out


@dataclass(frozen=True)
class HermesFormat(_ChatML):
    """Qwen2.5/Hermes chat markup with one ``<tool_call>`` block per call."""

    name: str = "hermes"
    turn_end: str = "<|im_end|>"
    call_frame: tuple[str, str] = ("\n", "\n")
    """What ``assistant_text`` writes between the tags and a call's JSON."""

    def tools_block(self, tools: list[dict]) -> str:
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "\n\n# Tools\n<tools>\n" + lines + "\n</tools>\n"
            'Call a tool as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>'
        )

    def assistant_text(self, content: str, calls: list[ToolCall]) -> str:
        """What the model emits for one turn, up to and including the turn-end marker."""
        parts = [content] if content else []
        parts += [f"<tool_call>\n{tool_json(c.name, c.arguments)}\n</tool_call>" for c in calls]
        return "\n".join(parts) + self.turn_end

    def preamble(self, messages, tools: list[dict] = ()) -> str:
        """What the chat template puts before a whole dialogue: a system turn listing the tools
        when the dialogue has tools but does not open with a system message."""
        if tools and not (messages and messages[0].role == "system"):
            return "<|im_start|>system\n" + self.tools_block(tools).lstrip("\n") + "<|im_end|>\n"
        return ""

    def _block_calls(self, obj) -> list:
        """The calls one ``<tool_call>`` block holds: one JSON object."""
        return [obj]


@dataclass(frozen=True)
class SmolLM2Format(_ChatML):
    """SmolLM2-Instruct: ChatML turns; all of a turn's calls in one ``<tool_call>[...]</tool_call>``."""

    name: str = "smollm2"
    turn_end: str = "<|im_end|>"
    call_frame: tuple[str, str] = ("[", "]")
    """A forced turn's one call, as the list ``assistant_text`` writes."""

    def tools_block(self, tools: list[dict]) -> str:
        return (
            "\n\nYou have access to the following tools:\n<tools>"
            + json.dumps(tools, ensure_ascii=False)
            + "</tools>\n\nThe output MUST strictly adhere to the following format, and NO other text MUST be "
            "included.\n<tool_call>[\n{\"name\": \"func_name1\", \"arguments\": {\"argument1\": \"value1\"}},\n"
            "... (more tool calls as required)\n]</tool_call>"
        )

    def assistant_text(self, content: str, calls: list[ToolCall]) -> str:
        parts = [content] if content else []
        if calls:
            parts.append("<tool_call>[" + ", ".join(tool_json(c.name, c.arguments) for c in calls) + "]</tool_call>")
        return "\n".join(parts) + self.turn_end

    default_system: str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    """What SmolLM2's chat template puts first when a dialogue has no system message."""

    tools_system: str = (
        "You are an expert in composing functions. You are given a question and a set of possible functions. "
        "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
        "If none of the functions can be used, point it out and refuse to answer. If the given question lacks the "
        "parameters required by the function, also point it out.")
    """The system message of SmolLM2's function-calling data (its model card's tool-use prompt)."""

    def preamble(self, messages, tools: list[dict] = ()) -> str:
        """When the dialogue opens without a system message: SmolLM2's default one (its own
        template does that) or, when there are tools, the system message its function-calling
        data used, with the tools listed (SmolLM2's template has no tool markup)."""
        if messages and messages[0].role == "system":
            return ""
        if tools:
            return f"<|im_start|>system\n{self.tools_system}{self.tools_block(tools)}<|im_end|>\n"
        return f"<|im_start|>system\n{self.default_system}<|im_end|>\n"

    def _block_calls(self, obj) -> list:
        """A block holds a list of calls (or one call)."""
        return obj if isinstance(obj, list) else [obj]


def _call_of(obj) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ToolCallParseError("tool call lacks a string 'name'")
    args = obj.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolCallParseError("tool call 'arguments' is not an object")
    return ToolCall(obj["name"], args)


FORMATS: dict[str, ChatFormat] = {f.name: f for f in (HermesFormat(), SmolLM2Format())}


def get_format(name: str) -> ChatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown chat format {name!r}; known: {sorted(FORMATS)}") from None
