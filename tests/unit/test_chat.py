import json

import pytest

from rlonce.envs.toolfind.env import SYSTEM_PROMPT
from rlonce.envs.workspace import BASH_TOOL, SUBMIT_TOOL
from rlonce.model.chat import ToolCall, ToolCallParseError, get_format

FMT = get_format("hermes")


def _dialogue():
    calls = [ToolCall("bash", {"command": "grep -r falcon.color docs"}), ToolCall("submit", {"answer": "red"})]
    return calls, [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is the color of falcon?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": calls[0].name, "arguments": calls[0].arguments}}]},
        {"role": "tool", "content": "docs/a.txt:falcon.color = red"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": calls[1].name, "arguments": calls[1].arguments}}]},
    ]


@pytest.mark.parametrize("tools", [[BASH_TOOL, SUBMIT_TOOL], []])
def test_deltas_match_the_model_folders_chat_template(lm, tools):
    """Session deltas concatenate to exactly what the HF chat template renders for the dialogue."""
    calls, messages = _dialogue()
    deltas = (FMT.opening(SYSTEM_PROMPT, messages[1]["content"], tools)
              + FMT.assistant_text("", [calls[0]])
              + FMT.observation([messages[3]["content"]])
              + FMT.assistant_text("", [calls[1]]))
    rendered = lm.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
    assert rendered.rstrip("\n") == deltas


def test_tokenizing_deltas_equals_tokenizing_the_whole(lm):
    calls, messages = _dialogue()
    parts = [FMT.opening(SYSTEM_PROMPT, messages[1]["content"], []), FMT.assistant_text("", [calls[0]]),
             FMT.observation([messages[3]["content"]]), FMT.assistant_text("", [calls[1]])]
    assert sum((lm.encode(p) for p in parts), []) == lm.encode("".join(parts))


def test_copyable_words_are_single_tokens(lm):
    from rlonce.envs.toolfind.tasks import ATTRIBUTES, ENTITIES, LINKS, VALUES

    for w in [*ENTITIES, *LINKS, *ATTRIBUTES, *(v for vs in VALUES.values() for v in vs)]:
        assert len(lm.encode(w)) == 1, w
        assert lm.encode(w)[0] in lm.encode(f"grep -r {w}.x")  # the same token after a space


def test_parse_tool_calls():
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    assert FMT.parse_tool_calls(text) == [ToolCall("bash", {"command": "ls"})]
    for bad in ["no call here", "<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                '<tool_call>{"name": "x", "arguments": [1]}</tool_call>']:
        with pytest.raises(ToolCallParseError):
            FMT.parse_tool_calls(bad)
    assert json.loads(FMT.assistant_text("", [ToolCall("submit", {"answer": "ré"})]).split("\n")[1])["arguments"] == {
        "answer": "ré"}


def test_tokenizer_fits_the_embedding(lm):
    assert len(lm.tokenizer) <= lm.model.config.vocab_size
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in lm.eos_token_ids


def test_render_matches_the_template_for_any_dialogue(lm):
    """Consecutive tool results share one user turn; client-written assistant turns render as the
    template renders them; a continuation appended to a recorded turn equals the whole render."""
    from rlonce.gateway.messages import Message

    call = ToolCall("bash", {"command": "ls"})
    msgs = [Message("system", SYSTEM_PROMPT), Message("user", "q"), Message("assistant", "two calls", (call, call)),
            Message("tool", "a"), Message("tool", "b"), Message("user", "and?"), Message("assistant", "plain")]
    as_dicts = [{"role": m.role, "content": m.content, "tool_calls": [
        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]}
        for m in msgs]
    for tools in ([BASH_TOOL, SUBMIT_TOOL], []):
        want = lm.tokenizer.apply_chat_template(as_dicts, tools=tools or None, tokenize=False,
                                                add_generation_prompt=True)
        assert FMT.render(msgs, tools) == want
    # no leading system message, and a system reminder mid-history (as agent CLIs send): the tools
    # are listed once, in a system turn put first; the reminder is a system turn where it stands
    reminder = Message("system", "<system-reminder>stay brief</system-reminder>")
    for dialogue in (msgs[1:], msgs[1:4] + [reminder] + msgs[4:], msgs[:4] + [reminder] + msgs[4:]):
        as_dicts = [{"role": m.role, "content": m.content, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]}
            for m in dialogue]
        want = lm.tokenizer.apply_chat_template(as_dicts, tools=[BASH_TOOL, SUBMIT_TOOL], tokenize=False,
                                                add_generation_prompt=True)
        text = FMT.render(dialogue, [BASH_TOOL, SUBMIT_TOOL])
        assert text == want and text.count("# Tools") == 1
        assert '"name": "bash"' in text.split("<|im_end|>")[0]  # in the first turn, whatever opens the dialogue
    head = FMT.render(msgs[:3], [], generation_prompt=False).removesuffix("\n")  # ends at the turn-end token
    assert head + FMT.continuation(msgs[3:6], turn_open=False) == FMT.render(msgs[:6], [])
    # a turn cut by the token cap gets its end marker from the continuation
    open_turn = head.removesuffix(FMT.turn_end)
    assert open_turn + FMT.continuation(msgs[3:6], turn_open=True) == FMT.render(msgs[:6], [])


def test_split_turn_flags_malformed_and_unknown_calls():
    ok = FMT.assistant_text("thinking", [ToolCall("bash", {"command": "ls"})])
    assert FMT.split_turn(ok, {"bash"}) == ("thinking", [ToolCall("bash", {"command": "ls"})], None)
    assert FMT.split_turn(ok, {"submit"})[2] == "unknown_tool"
    assert FMT.split_turn("<tool_call>{x</tool_call><|im_end|>", {"bash"}) == ("<tool_call>{x</tool_call>", [],
                                                                              "malformed_tool_call")
    assert FMT.split_turn(ok, None) == (ok.removesuffix("<|im_end|>"), [], None)  # no tools offered: plain text


@pytest.mark.parametrize("fmt", ["hermes", "smollm2"])
def test_a_closing_tag_inside_an_argument_is_part_of_the_argument(fmt):
    """The call's JSON is read as JSON, not up to the first ``</tool_call>``: an argument may hold
    the tag (SmolLM2 wrote one under a forced tool call), and the text beside the blocks is the content."""
    f = get_format(fmt)
    call = ToolCall("bash", {"command": 'echo "}}]</tool_call> x"'})
    turn = f.assistant_text("before", [call])
    assert f.split_turn(turn, {"bash"}) == ("before", [call], None)
    close = turn.rindex(f.call_markup[1])
    for bad in (turn[:close] + turn[close + len(f.call_markup[1]):], turn[:close] + "stray" + turn[close:]):
        assert f.split_turn(bad, {"bash"})[2] == "malformed_tool_call", bad
