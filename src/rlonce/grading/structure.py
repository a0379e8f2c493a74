"""What a judge asks an endpoint for: its verdict's JSON schema, in each wire protocol's shape.

A judge's question carries a pydantic schema (``rlonce.grading.verdicts``); an endpoint that
decodes under a schema — OpenAI's structured outputs, Anthropic's forced tools, ``rlonce serve``
and vLLM through a grammar engine — then answers with JSON that is the schema, where a small model
left to itself writes prose. The requests:

- OpenAI Chat Completions: ``response_format = {"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}``;
- Anthropic Messages: one tool named after the schema, its ``input_schema`` the schema, and
  ``tool_choice = {"type": "tool", "name": ...}``; the verdict is the ``tool_use`` block's input;
- an agentic grader: its ``submit`` tool's ``answer`` is the schema, every turn asks for a tool
  call (``tool_choice`` required / Anthropic ``any``) and the last turn for ``submit`` by name.

The schema sent is ``model_json_schema()`` with ``$ref``s inlined. Strict mode (OpenAI's rule:
every object closed, every property required) is asked for only where it keeps the meaning:
closing an object drops only keys our verdicts ignore, and requiring a field that has a default
still admits every value it can take. A schema with an open mapping (a ``dict`` field, a model
that keeps extra keys) or a recursive one is sent as it is, with ``strict: false``.

An endpoint without structured output answers such a request with a 4xx naming the feature
(``refuses_structure``); the judge then asks once more without it — the prompt-and-parse path —
and counts the call ``unstructured``. What this does not do: it never trusts the endpoint's
enforcement, every reply is validated against the schema as before.
"""

from __future__ import annotations

import copy
import functools
import re

from pydantic import BaseModel

from rlonce.envs.base import function_tool

REFUSED = re.compile(r"response_format|json_schema|tool_choice|input_schema|\btools?\b|structured|strict|"
                     r"unsupported|not supported|guided", re.I)
"""Words of a 4xx that refuses a structured request."""
NOT_A_REFUSAL = (401, 403, 404, 408, 413, 429)
"""4xx statuses that are about the key, the path, the size or the rate, never the structure."""
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


class _Recursive(Exception):
    pass


def _inline(node, defs: dict, seen: tuple[str, ...] = ()):
    if isinstance(node, list):
        return [_inline(x, defs, seen) for x in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen:
            raise _Recursive(name)
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(defs[name], defs, (*seen, name)), **_inline(rest, defs, seen)}
    return {k: _inline(v, defs, seen) for k, v in node.items() if k != "$defs"}


def _subschemas(node: dict):
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from node[key].values()
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from node[key]
    for key in _SUBSCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield node[key]


def _close(node: dict) -> bool:
    """Make ``node`` and its subschemas strict in place; False when that would change the meaning
    (an object open to keys it does not name)."""
    if node.get("type") == "object" or "properties" in node:
        if node.get("additionalProperties", False) is not False or "patternProperties" in node:
            return False
        if not node.get("properties"):
            return False
        node["additionalProperties"] = False
        node["required"] = list(node["properties"])
    node.pop("default", None)  # every property is required: a default can no longer apply
    return all(_close(sub) for sub in _subschemas(node))


@functools.lru_cache(maxsize=512)  # bounded: GAR asks under a schema class per set of passing attempts
def _wire(schema: type[BaseModel]) -> tuple[dict, bool]:
    raw = schema.model_json_schema()
    try:
        inlined = _inline(raw, raw.get("$defs", {}))
    except _Recursive:
        return raw, False
    strict = copy.deepcopy(inlined)
    return (strict, True) if _close(strict) else (inlined, False)


def wire_schema(schema: type[BaseModel]) -> tuple[dict, bool]:
    """``schema``'s JSON schema as sent, and whether it is strict (see the module docstring)."""
    body, strict = _wire(schema)
    return copy.deepcopy(body), strict


def response_format(schema: type[BaseModel]) -> dict:
    """OpenAI's ``response_format`` asking for ``schema``."""
    body, strict = wire_schema(schema)
    return {"type": "json_schema", "json_schema": {"name": schema.__name__, "schema": body, "strict": strict}}


def answer_tool(schema: type[BaseModel]) -> dict:
    """Anthropic's tool whose input is ``schema``: the judge forces it and reads its input."""
    return {"name": schema.__name__, "description": f"Give your verdict: a {schema.__name__} object.",
            "input_schema": wire_schema(schema)[0]}


def submit_tool(schema: type[BaseModel]) -> dict:
    """An agentic grader's ``submit`` tool: its ``answer`` is the verdict object."""
    return function_tool("submit", f"Submit your verdict: a {schema.__name__} object.",
                         {"answer": wire_schema(schema)[0]}, ["answer"])


def tool_choice(protocol: str, name: str | None) -> dict | str:
    """``protocol``'s tool choice: the tool ``name``, or any tool (None)."""
    if protocol == "anthropic-messages":
        return {"type": "tool", "name": name} if name else {"type": "any"}
    if protocol == "openai-responses":
        return {"type": "function", "name": name} if name else "required"
    return {"type": "function", "function": {"name": name}} if name else "required"


def refuses_structure(status: int, text: str) -> bool:
    """Whether an error reply (``status``, body ``text``) to a structured request says the endpoint
    cannot give structured output: a 4xx naming the feature, not one about the key or the rate."""
    return 400 <= status < 500 and status not in NOT_A_REFUSAL and REFUSED.search(text) is not None
