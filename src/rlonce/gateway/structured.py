"""Structured output: a reply that must be JSON matching a schema, or one call of given tools,
enforced the way the real APIs enforce it — by constrained decoding, not by asking nicely.

Each protocol names it differently (OpenAI Chat ``response_format`` and ``tool_choice``, OpenAI
Responses ``text.format`` and ``tool_choice``, Anthropic ``output_config.format`` and
``tool_choice``); the parsers here turn each into one ``Structure`` and refuse malformed shapes
with a 400 naming the field. ``accept`` then decides, once per request and before any session is
touched, what the engine enforces (``ChatRequest.constraint``):

- a schema: the reply is compact JSON matching it (``constrain.json_schema``); with tools offered
  and ``tool_choice`` auto, the reply is either that JSON or one tool call (an agent with an
  output type still calls its tools);
- ``required``/``any``, a named tool: the reply is exactly one call, of an allowed tool, with
  arguments valid against its parameters, in the chat format's own markup (``call_grammar``);
- ``none`` with tools offered: the reply holds no tool call (``no_call_grammar``), and any
  tool-call markup is returned as text.

A schema marked strict (a strict tool's parameters, Anthropic's ``output_config.format``) must be
enforced exactly: a keyword llguidance does not implement (``not``, ``if``/``then``,
``uniqueItems``, …) is a 400 naming it. Not strict — OpenAI's default, where the real API only
follows the schema as well as it can — such keywords are ignored and the rest enforced.

A gateway that does not honour the client's sampling (the trainer's: the policy samples with the
run's own settings) refuses any constraint: the trainer computes log-probs over the whole
vocabulary, so a masked sample's recorded log-probs would not match the ones it trains on.
"""

from __future__ import annotations

import json
from dataclasses import replace

from rlonce.engine.base import Constraint
from rlonce.gateway.messages import ChatRequest, ProtocolError, Structure

CHOICES = ("auto", "none", "required")


def _obj(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"'{where}' must be an object", param=where)
    return value


def _schema(value, where: str) -> dict:
    if value is None:
        return {}  # no schema given: any JSON value
    if not isinstance(value, dict):
        raise ProtocolError(f"'{where}' must be a JSON schema object", param=where)
    return value


def _strict(value, where: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ProtocolError(f"'{where}' must be a boolean", param=where)
    return bool(value)


def openai_format(value, where: str, nested: bool) -> dict:
    """The ``Structure`` fields of an OpenAI response format: Chat's ``response_format`` (the
    schema under ``json_schema``, ``nested``) or Responses' ``text.format`` (at that level)."""
    if value is None:
        return {}
    fmt = _obj(value, where)
    kind = fmt.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"schema": {"type": "object"}, "schema_field": where, "strict": True}
    if kind == "json_schema":
        at = f"{where}.json_schema" if nested else where
        spec = _obj(fmt.get("json_schema"), at) if nested else fmt
        return {"schema": _schema(spec.get("schema"), f"{at}.schema"), "schema_field": f"{at}.schema",
                "strict": _strict(spec.get("strict"), f"{at}.strict")}
    raise ProtocolError(f"'{where}.type' must be text, json_object or json_schema, not {kind!r}",
                        param=f"{where}.type")


def anthropic_format(body: dict) -> dict:
    """``output_config.format`` (structured outputs: always strict)."""
    config = body.get("output_config")
    if config is None:
        return {}
    fmt = _obj(config, "output_config").get("format")
    if fmt is None:
        return {}
    fmt = _obj(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise ProtocolError(f"'output_config.format.type' must be json_schema, not {fmt.get('type')!r}",
                            param="output_config.format.type")
    return {"schema": _schema(fmt.get("schema"), "output_config.format.schema"),
            "schema_field": "output_config.format.schema", "strict": True}


def openai_tool_choice(value, responses: bool) -> tuple[str, str | None, tuple[str, ...]]:
    """(choice, named tool, allowed tools) of an OpenAI ``tool_choice``: a mode string, a named
    function (Chat nests the name under ``function``), or ``allowed_tools``. A hosted or custom
    tool's choice is ``auto`` here: only function tools are offered to the model."""
    if value is None:
        return "auto", None, ()
    if isinstance(value, str):
        if value not in CHOICES:
            raise ProtocolError(f"'tool_choice' must be none, auto, required or an object naming a function, "
                                f"not {value!r}", param="tool_choice")
        return value, None, ()
    choice = _obj(value, "tool_choice")
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name") if responses else _obj(choice.get("function"), "tool_choice.function").get("name")
        if not isinstance(name, str) or not name:
            where = "tool_choice.name" if responses else "tool_choice.function.name"
            raise ProtocolError(f"'{where}' must name a function", param=where)
        return "named", name, (name,)
    if kind == "allowed_tools":
        spec = choice if responses else _obj(choice.get("allowed_tools"), "tool_choice.allowed_tools")
        mode = spec.get("mode")
        if mode not in ("auto", "required"):
            raise ProtocolError("'tool_choice' allowed_tools mode must be auto or required", param="tool_choice")
        tools = spec.get("tools")
        if not isinstance(tools, list):
            raise ProtocolError("'tool_choice' allowed_tools needs a 'tools' array", param="tool_choice")
        names = []
        for t in tools:
            fn = t.get("function", t) if isinstance(t, dict) and not responses else t
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
        return mode, None, tuple(names)
    if isinstance(kind, str):
        return "auto", None, ()  # a hosted or custom tool: not one the model is offered
    raise ProtocolError("'tool_choice' needs a 'type'", param="tool_choice")


def anthropic_tool_choice(value) -> tuple[str, str | None, tuple[str, ...]]:
    if value is None:
        return "auto", None, ()
    choice = _obj(value, "tool_choice")
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, None, ()
    if kind == "any":
        return "required", None, ()
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError("'tool_choice.name' must name a tool", param="tool_choice.name")
        return "named", name, (name,)
    raise ProtocolError(f"'tool_choice.type' must be auto, any, tool or none, not {kind!r}", param="tool_choice.type")


def structure(output: dict, choice: tuple[str, str | None, tuple[str, ...]], tools: list[dict],
              others: set[str], strict_tools: list[tuple[str, str]]) -> Structure:
    """The request's ``Structure``: ``output`` from a format parser, ``choice`` from a tool-choice
    parser, ``tools`` the function tools offered, ``others`` the names of tools the model is not
    offered (hosted, server or custom tools: a choice of those forces nothing here)."""
    mode, name, allowed = choice
    offered = {t["name"] for t in tools}
    for n in allowed:
        if n not in offered and n not in others:
            raise ProtocolError(f"'tool_choice' names the tool {n!r}, which is not among the request's tools",
                                param="tool_choice")
    if mode in ("required", "named"):
        allowed = tuple(n for n in allowed if n in offered) if allowed else tuple(sorted(offered))
        if not allowed:
            if not others:
                raise ProtocolError(f"'tool_choice' {mode} needs tools: the request has none", param="tool_choice")
            mode, name, allowed = "auto", None, ()  # only tools the model is not offered: nothing to force
    return Structure(**output, tool_choice=mode, tool=name, allowed=allowed, strict_tools=tuple(strict_tools))


def accept(req: ChatRequest, settings) -> ChatRequest:
    """``req`` with the ``Constraint`` its structure asks for, or a 400: a gateway that does not
    honour client sampling (training) refuses any; a schema the grammar engine cannot enforce is
    refused naming the field and the keyword."""
    s = req.structure
    if s.constrained and not settings.honor_client_sampling:
        what = f"'{s.schema_field}'" if s.schema is not None and not s.forced else f"tool_choice {s.tool_choice}"
        raise ProtocolError(f"{what} asks for constrained decoding, which a training gateway refuses: the trainer "
                            "computes log-probs over the whole vocabulary, so a masked sample's log-probs would not "
                            "match; serve the model with `rlonce serve` to use structured output",
                            param=s.schema_field if s.schema is not None and not s.forced else "tool_choice")
    if not settings.honor_client_sampling or not (s.constrained or (s.tool_choice == "none" and req.tools)):
        return req
    constraint = _constraint(req, settings)
    return req if constraint is None else replace(req, constraint=constraint)


def _constraint(req: ChatRequest, settings) -> Constraint | None:
    from rlonce.engine import constrain  # torch and llguidance: only a request that asks for structure loads them

    s, fmt = req.structure, settings.fmt
    tools = [t for t in req.tools if t["name"] in s.allowed] if s.forced else req.tools
    special = frozenset(m for m in fmt.call_markup if len(settings.encode(m)) == 1)
    strict = dict(s.strict_tools)
    if s.forced or (s.schema is not None and tools and s.tool_choice == "auto"):
        for t in tools:
            if t["name"] in strict:
                _refuse(constrain.check(constrain.json_schema(t["parameters"])), strict[t["name"]])
        lenient = any(t["name"] not in strict for t in tools)
        if s.forced:
            return _checked(constrain.lark(fmt.call_grammar(tools, special=special, lenient=lenient)), "tools")
        if s.strict:
            _refuse(constrain.check(constrain.json_schema(_rooted(s.schema))), s.schema_field)
        reply = {"x-guidance": {**constrain.JSON_OPTIONS, "lenient": not s.strict}, **_rooted(s.schema)}
        grammar = (fmt.call_grammar(tools, special=special, lenient=lenient, rule="call")
                   + f"\nreply: %json {json.dumps(reply, ensure_ascii=False)}\nstart: call | reply")
        return _checked(constrain.lark(grammar), s.schema_field)
    if s.schema is not None:
        if s.strict:
            _refuse(constrain.check(constrain.json_schema(s.schema)), s.schema_field)
            return constrain.json_schema(_rooted(s.schema))
        return _checked(constrain.json_schema({"x-guidance": {**constrain.JSON_OPTIONS, "lenient": True},
                                               **_rooted(s.schema)}), s.schema_field)
    if s.tool_choice == "none" and req.tools:
        return constrain.lark(fmt.no_call_grammar(special=special))
    return None


def _rooted(schema: dict) -> dict:
    """``schema`` without its own ``x-guidance`` (the gateway sets the options)."""
    return {k: v for k, v in schema.items() if k != "x-guidance"}


def _checked(c: Constraint, field: str) -> Constraint:
    from rlonce.engine import constrain

    _refuse(constrain.check(c), field)
    return c


def _refuse(problem: str | None, field: str) -> None:
    if problem:
        raise ProtocolError(f"'{field}' cannot be enforced by this server's structured output: {problem}", param=field)
