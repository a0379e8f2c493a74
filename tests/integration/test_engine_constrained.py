"""Constrained decoding in the torch engine (``rlonce.engine.constrain``) on the embedded model:
every constrained reply matches its grammar, rows without a constraint in the same batch are
untouched, the recorded log-probs are those of the masked distribution, and what cannot be
enforced is refused in one line before it queues."""

import asyncio
import copy
import json
import re

import pytest
import torch
from conftest import gen_many

from rlonce.engine import constrain
from rlonce.engine.base import Constraint, SamplingParams
from rlonce.engine.torch_engine import TorchEngine, process_logits
from rlonce.model.chat import get_format

SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["pass", "fail"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 10},
                                           "reason": {"type": "string", "maxLength": 30}},
          "required": ["verdict", "score", "reason"], "additionalProperties": False}


@pytest.fixture
def engine(lm):
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, max_batch_size=16,
                      batch_wait_s=0.05, tokenizer=lm.tokenizer)
    yield eng
    eng.close()


def _prompt(lm, text: str) -> list[int]:
    return lm.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True))


def _text(lm, gen) -> str:
    return lm.decode([t for t in gen.token_ids if t not in lm.eos_token_ids])


def test_json_schema_replies_are_valid_and_unconstrained_rows_in_the_batch_are_untouched(engine, lm):
    prompt = _prompt(lm, "Grade the answer. Reply in JSON.")
    c = constrain.json_schema(SCHEMA)
    plain = [SamplingParams(max_tokens=80, seed=100 + i) for i in range(4)]
    alone = gen_many(engine, [prompt] * 4, plain)
    mixed = gen_many(engine, [prompt] * 12, plain + [SamplingParams(max_tokens=80, seed=i, constraint=c)
                                                     for i in range(8)])
    assert [g.token_ids for g in mixed[:4]] == [g.token_ids for g in alone]  # seeded: the mask touched no other row
    for g in mixed[4:]:
        assert g.finish_reason == "stop", g
        obj = json.loads(_text(lm, g))
        assert list(obj) == ["verdict", "score", "reason"]  # the schema's order
        assert obj["verdict"] in ("pass", "fail") and 0 <= obj["score"] <= 10 and len(obj["reason"]) <= 30
        assert g.metrics["constrained_tokens"] == len(g.token_ids)
    assert all(g.metrics["constrained_tokens"] == 0 for g in mixed[:4])


def test_regex_choice_and_a_tool_call_grammar(engine, lm):
    prompt = _prompt(lm, "Answer.")
    tool = {"type": "object", "properties": {"command": {"type": "string", "maxLength": 20}},
            "required": ["command"], "additionalProperties": False}
    fmt = get_format("hermes")  # the embedded model's: <tool_call> is one added token
    special = frozenset(m for m in fmt.call_markup if len(lm.encode(m)) == 1)
    call = constrain.lark(fmt.call_grammar([{"name": "bash", "parameters": tool}], special=special))
    cases = [(constrain.regex(r"[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
             (constrain.choice(["yes", "no", "unsure"]), lambda t: t in ("yes", "no", "unsure")),
             (call, lambda t: [c.name for c in fmt.parse_tool_calls(t)] == ["bash"])]
    gens = gen_many(engine, [prompt] * 9, [SamplingParams(max_tokens=80, seed=i, constraint=c)
                                           for i in range(3) for c, _ in cases])
    for i, g in enumerate(gens):
        text, (_, ok) = _text(lm, g), cases[i % 3]
        assert g.finish_reason == "stop" and ok(text), (i, text)


def test_logprobs_are_of_the_masked_distribution(engine, lm):
    """Each recorded log-prob is the token's log-softmax over the tokens the grammar allowed at
    its position (temperature 0.7): replayed through a fresh matcher and the model's forward."""
    prompt = _prompt(lm, "JSON please.")
    c = constrain.json_schema(SCHEMA)
    g = gen_many(engine, [prompt], [SamplingParams(max_tokens=80, temperature=0.7, seed=3, constraint=c)])[0]
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        logits = lm.model(ids).logits[0, len(prompt) - 1:-1].float()
    masks = constrain.Masks(lm.tokenizer, lm.model.config.vocab_size, lm.eos_token_ids)
    m = masks.matcher(c)
    for pos, tok in enumerate(g.token_ids):
        row = masks.apply(logits[pos:pos + 1], [m])
        want = process_logits(row, torch.tensor([0.7]), torch.tensor([0]), torch.tensor([1.0]))[0, tok]
        assert abs(float(want) - g.logprobs[pos]) < 2e-4, (pos, float(want), g.logprobs[pos])
        assert int(row.isfinite().sum()) < row.shape[-1]  # the grammar cut something at every position
        m.consume_token(tok)
    assert m.is_stopped()


def test_a_resumed_turn_keeps_its_grammar(engine, lm):
    """A constraint with a ``prefix`` (a paused turn's tokens so far) continues where they left off."""
    prompt = _prompt(lm, "JSON please.")
    c = constrain.json_schema(SCHEMA)
    head = lm.encode('{"verdict":"fail","score":')
    g = gen_many(engine, [prompt + head], [SamplingParams(max_tokens=60, seed=5,
                                                          constraint=Constraint(c.kind, c.spec, tuple(head)))])[0]
    obj = json.loads('{"verdict":"fail","score":' + _text(lm, g))
    assert obj["verdict"] == "fail" and 0 <= obj["score"] <= 10


@pytest.mark.parametrize("schema, says", [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                                          ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
                                          ({"not": {"type": "string"}}, '"not"')])
def test_what_cannot_be_enforced_is_refused_before_it_queues(engine, lm, schema, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        gen_many(engine, [[1, 2, 3]], [SamplingParams(max_tokens=8, constraint=constrain.json_schema(schema))])
    assert engine.stats["waves"] == 0


def test_an_engine_without_its_tokenizer_refuses_a_constraint(lm):
    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0)
    try:
        with pytest.raises(ValueError, match="without its tokenizer"):
            gen_many(eng, [[1, 2, 3]], [SamplingParams(max_tokens=8, constraint=constrain.json_object())])
    finally:
        eng.close()


def test_a_matcher_in_error_fails_its_row_alone(engine, lm):
    """A grammar that quotes the embedded model's added token as text: llguidance's mask lets the
    token through, then refuses it, and the matcher is in error. That is a grammar bug (ours), so
    the row fails as an engine error — it does not quietly end its turn — and its batch company
    goes on (``ChatFormat.call_grammar`` writes such a token the way llguidance reads it)."""
    from rlonce.engine.base import EngineError

    async def go():
        quoted = constrain.lark('start: "<tool_call>" "x"')
        bad = engine.generate([1, 2, 3], SamplingParams(max_tokens=8, constraint=quoted))
        good = engine.generate([1, 2, 3], SamplingParams(max_tokens=8, seed=1))
        return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = asyncio.run(go())
    assert isinstance(bad, EngineError) and "grammar matcher failed" in str(bad)
    assert not isinstance(good, BaseException) and good.token_ids
