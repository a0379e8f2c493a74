"""Structured output in the gateway: each protocol's fields parsed into one ``Structure``, the 400s
for malformed shapes and unenforceable schemas, the training gateway's refusal, and the chat
formats' tool-call grammars checked against what the formats write and parse (llguidance over
the embedded model's tokenizer)."""

import json

import llguidance
import llguidance.hf
import pytest

from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.gateway.messages import ProtocolError
from rlonce.gateway.protocols import PROTOCOLS
from rlonce.gateway.session import GatewaySettings
from rlonce.gateway.structured import accept
from rlonce.model.chat import ToolCall, get_format

BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
        "additionalProperties": False}
READ = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"$ref": "#/$defs/n"}},
        "required": ["path", "lines"], "$defs": {"n": {"type": "integer", "minimum": 1}}}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": BASH}},
              {"type": "function", "function": {"name": "read", "parameters": READ}}]
RESP_TOOLS = [{"type": "function", "name": "bash", "parameters": BASH},
              {"type": "function", "name": "read", "parameters": READ}]
ANT_TOOLS = [{"name": "bash", "input_schema": BASH}, {"name": "read", "input_schema": READ}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
MSGS = [{"role": "user", "content": "q"}]


def _chat(**kw):
    return PROTOCOLS["openai-chat"].parse({"messages": MSGS, **kw})


def _responses(**kw):
    return PROTOCOLS["openai-responses"].parse({"input": "q", **kw})


def _messages(**kw):
    return PROTOCOLS["anthropic-messages"].parse({"max_tokens": 9, "messages": MSGS, **kw})


def _settings(honor=True, fmt="hermes"):
    return GatewaySettings(engine=ScriptedEngine([], lambda s: [0]), encode=lambda s: list(s.encode()),
                           decode=lambda ids: bytes(ids).decode(), fmt=get_format(fmt),
                           sampling=SamplingParams(), honor_client_sampling=honor)


def _refused(parse, param: str, words: str, settings=None):
    with pytest.raises(ProtocolError) as e:
        req = parse()
        accept(req, settings or _settings())
    assert e.value.status == 400 and e.value.param == param and words in str(e.value), (e.value.param, str(e.value))
    assert "\n" not in str(e.value)


def test_each_protocol_names_the_same_structure():
    chat = _chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER,
                                                                         "strict": True}})
    resp = _responses(text={"format": {"type": "json_schema", "name": "a", "schema": ANSWER, "strict": True}})
    ant = _messages(output_config={"format": {"type": "json_schema", "schema": ANSWER}})
    for req, field in ((chat, "response_format.json_schema.schema"), (resp, "text.format.schema"),
                       (ant, "output_config.format.schema")):
        s = req.structure
        assert (s.schema, s.schema_field, s.strict, s.tool_choice, s.constrained) == (ANSWER, field, True, "auto", True)
    assert _chat(response_format={"type": "json_object"}).structure.schema == {"type": "object"}
    assert _responses(text={"format": {"type": "json_object"}}).structure.schema == {"type": "object"}
    for req in (_chat(response_format={"type": "text"}), _responses(text={"format": {"type": "text"}}), _messages()):
        assert req.structure.schema is None and not req.structure.constrained
    assert not _chat(response_format={"type": "json_schema", "json_schema": {"schema": ANSWER}}).structure.strict


def test_tool_choices_of_each_protocol():
    cases = [
        (_chat(tools=CHAT_TOOLS, tool_choice="required"), "required", None, ("bash", "read")),
        (_chat(tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "read"}}), "named", "read",
         ("read",)),
        (_chat(tools=CHAT_TOOLS, tool_choice="none"), "none", None, ()),
        (_chat(tools=CHAT_TOOLS), "auto", None, ()),
        (_responses(tools=RESP_TOOLS, tool_choice="required"), "required", None, ("bash", "read")),
        (_responses(tools=RESP_TOOLS, tool_choice={"type": "function", "name": "bash"}), "named", "bash", ("bash",)),
        (_responses(tools=RESP_TOOLS, tool_choice={"type": "allowed_tools", "mode": "required",
                                                   "tools": [{"type": "function", "name": "read"}]}),
         "required", None, ("read",)),
        (_messages(tools=ANT_TOOLS, tool_choice={"type": "any"}), "required", None, ("bash", "read")),
        (_messages(tools=ANT_TOOLS, tool_choice={"type": "tool", "name": "bash"}), "named", "bash", ("bash",)),
        (_messages(tools=ANT_TOOLS, tool_choice={"type": "none"}), "none", None, ()),
        (_messages(tools=ANT_TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True}), "auto", None,
         ()),
        # a choice of a tool the model is not offered (a server tool) forces nothing
        (_messages(tools=[{"type": "web_search_20250305", "name": "web_search"}], tool_choice={"type": "any"}),
         "auto", None, ()),
        (_messages(tools=[*ANT_TOOLS, {"type": "web_search_20250305", "name": "web_search"}],
                   tool_choice={"type": "tool", "name": "web_search"}), "auto", None, ()),
    ]
    for req, choice, name, allowed in cases:
        s = req.structure
        assert (s.tool_choice, s.tool, s.allowed) == (choice, name, allowed)


def test_malformed_shapes_are_400s_naming_the_field():
    _refused(lambda: _chat(response_format="json"), "response_format", "must be an object")
    _refused(lambda: _chat(response_format={"type": "xml"}), "response_format.type", "text, json_object or json_schema")
    _refused(lambda: _chat(response_format={"type": "json_schema", "json_schema": {"schema": 3}}),
             "response_format.json_schema.schema", "JSON schema object")
    _refused(lambda: _responses(text={"format": {"type": "json_schema", "schema": ANSWER, "strict": "yes"}}),
             "text.format.strict", "boolean")
    _refused(lambda: _chat(tools=CHAT_TOOLS, tool_choice="always"), "tool_choice", "none, auto, required")
    _refused(lambda: _chat(tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "rm"}}),
             "tool_choice", "'rm', which is not among the request's tools")
    _refused(lambda: _responses(tools=RESP_TOOLS, tool_choice={"type": "function"}), "tool_choice.name",
             "must name a function")
    _refused(lambda: _chat(tool_choice="required"), "tool_choice", "needs tools")
    _refused(lambda: _messages(tools=ANT_TOOLS, tool_choice={"type": "tool", "name": "rm"}), "tool_choice",
             "not among the request's tools")
    _refused(lambda: _messages(tools=ANT_TOOLS, tool_choice={"type": "sometimes"}), "tool_choice.type",
             "auto, any, tool or none")
    _refused(lambda: _messages(output_config={"format": {"type": "regex"}}), "output_config.format.type",
             "json_schema")


def test_a_strict_schema_the_grammar_engine_cannot_enforce_is_one_400_naming_the_keyword():
    odd = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    _refused(lambda: _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": odd,
                                                                                  "strict": True}}),
             "response_format.json_schema.schema", "uniqueItems")
    _refused(lambda: _responses(text={"format": {"type": "json_schema", "name": "x", "schema": odd, "strict": True}}),
             "text.format.schema", "uniqueItems")
    _refused(lambda: _messages(output_config={"format": {"type": "json_schema", "schema": odd}}),
             "output_config.format.schema", "uniqueItems")
    strict_tool = [{"type": "function", "function": {"name": "t", "parameters": odd, "strict": True}}]
    _refused(lambda: _chat(tools=strict_tool, tool_choice="required"), "tools[0].function.parameters", "uniqueItems")
    _refused(lambda: _messages(tools=[{"name": "t", "input_schema": odd, "strict": True}],
                               tool_choice={"type": "any"}), "tools[0].input_schema", "uniqueItems")
    # not strict (OpenAI's default): the keyword is ignored and the rest enforced
    loose = accept(_chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": odd}}),
                   _settings())
    assert loose.constraint.kind == "json_schema" and json.loads(loose.constraint.spec)["x-guidance"]["lenient"]
    assert accept(_chat(tools=[{**strict_tool[0], "function": {"name": "t", "parameters": odd}}],
                        tool_choice="required"), _settings()).constraint.kind == "lark"
    # a schema that is wrong, strict or not, is a 400 too
    _refused(lambda: _chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}),
             "response_format.json_schema.schema", "strin")


def test_the_training_gateway_refuses_constraints_and_keeps_the_rest():
    training = _settings(honor=False)
    for parse, param in ((lambda: _chat(response_format={"type": "json_object"}), "response_format"),
                         (lambda: _responses(text={"format": {"type": "json_schema", "name": "a", "schema": ANSWER}}),
                          "text.format.schema"),
                         (lambda: _chat(tools=CHAT_TOOLS, tool_choice="required"), "tool_choice"),
                         (lambda: _messages(tools=ANT_TOOLS, tool_choice={"type": "tool", "name": "bash"}),
                          "tool_choice")):
        _refused(parse, param, "log-probs", training)
        _refused(parse, param, "rlonce serve", training)
    for req in (_chat(tools=CHAT_TOOLS, tool_choice="auto"), _chat(tools=CHAT_TOOLS, tool_choice="none"),
                _chat(response_format={"type": "text"}), _messages(tools=ANT_TOOLS, tool_choice={"type": "none"})):
        assert accept(req, training).constraint is None


def test_what_a_serving_gateway_enforces():
    serving = _settings()
    assert accept(_chat(tools=CHAT_TOOLS), serving).constraint is None  # auto, no schema: free
    assert accept(_chat(), serving).constraint is None
    none = accept(_chat(tools=CHAT_TOOLS, tool_choice="none"), serving).constraint
    assert none.kind == "lark" and "<tool_call>" in none.spec and "%json" not in none.spec
    named = accept(_chat(tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "read"}}), serving)
    assert '"const": "read"' in named.constraint.spec and '"const": "bash"' not in named.constraint.spec
    both = accept(_chat(tools=CHAT_TOOLS, response_format={"type": "json_object"}), serving).constraint
    assert "start: call | reply" in both.spec  # an agent with an output type still calls its tools
    forced = accept(_chat(tools=CHAT_TOOLS, tool_choice="required", response_format={"type": "json_object"}),
                    serving).constraint
    assert "reply" not in forced.spec and '"const": "bash"' in forced.spec


def _matcher(lm, grammar: str):
    ll = llguidance.hf.from_tokenizer(lm.tokenizer, n_vocab=lm.model.config.vocab_size, eos_token=lm.eos_token_ids)
    return llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)


def _takes(lm, grammar: str, text: str) -> bool:
    m = _matcher(lm, grammar)
    return m.consume_tokens(lm.encode(text)) and m.is_accepting() and not m.is_error()


def test_the_call_grammar_takes_what_the_format_writes_and_parses(lm):
    fmt = get_format("hermes")
    tools = [{"name": "bash", "parameters": BASH}, {"name": "read", "parameters": READ}]
    special = frozenset(m for m in fmt.call_markup if len(lm.encode(m)) == 1)
    assert special == {"<tool_call>", "</tool_call>"}  # the embedded tokenizer holds both as added tokens
    grammar = fmt.call_grammar(tools, special=special)
    for call in (ToolCall("bash", {"command": "ls -la"}), ToolCall("read", {"path": "a.py", "lines": 3})):
        text = fmt.assistant_text("", [call])
        assert _takes(lm, grammar, text), text
        assert fmt.split_turn(text, {"bash", "read"}) == ("", [call], None)
    for wrong in (ToolCall("rm", {"command": "x"}), ToolCall("bash", {"cmd": "ls"}),
                  ToolCall("read", {"path": "a.py", "lines": 0})):  # unknown tool, bad argument, $ref'd minimum
        assert not _takes(lm, grammar, fmt.assistant_text("", [wrong])), wrong
    assert not _takes(lm, grammar, "Sure!" + fmt.turn_end)
    assert not _takes(lm, grammar, fmt.assistant_text("", [ToolCall("bash", {"command": "a"})] * 2))  # one call
    none = fmt.no_call_grammar(special=special)
    assert _takes(lm, none, "Sure, here it is." + fmt.turn_end)
    assert not _takes(lm, none, fmt.assistant_text("", [ToolCall("bash", {"command": "ls"})]))


def test_smollm2_call_grammar_is_its_list_markup():
    fmt = get_format("smollm2")
    grammar = fmt.call_grammar([{"name": "bash", "parameters": BASH}])
    assert grammar.startswith('start: "<tool_call>" "[" start_json "]" "</tool_call>"')
    schema = json.loads(grammar.split("%json ", 1)[1])
    assert schema["anyOf"][0]["properties"]["name"] == {"const": "bash"}
    assert schema["x-guidance"]["key_separator"] == ": "  # spaced as tool_json writes calls
    text = fmt.assistant_text("", [ToolCall("bash", {"command": "ls"})])
    assert text.startswith('<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}]</tool_call>')
