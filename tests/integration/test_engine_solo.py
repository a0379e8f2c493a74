"""The torch engine's compiled one-row decoding (``compile_solo``), on the embedded model: a lone
row decodes over a compiled static cache with the trainer's log-probs, moves back when a request
joins and in again when it is alone, keeps its cache for the next turn, sees new weights, and
decodes eagerly when compiling fails."""

import asyncio
import copy
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from rlonce.core import faults
from rlonce.engine.base import SamplingParams
from rlonce.engine.fast.solo import columns_for
from rlonce.engine.torch_engine import TorchEngine
from rlonce.train.trainer import token_logprobs

pytestmark = pytest.mark.fast_path  # compiled solo is part of the fast path

PROMPT = [1, 50, 60, 70, 80, 90]


def _engine(lm, **kw):
    return TorchEngine(copy.deepcopy(lm.model), eos_token_ids=[], pad_token_id=0, max_batch_size=16,
                       batch_wait_s=0.01, threads=1, **kw)


def _recomputed(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    return lp[0, len(prompt) - 1:]


def _one(engine, prompt, sampling):
    return asyncio.run(engine.generate(prompt, sampling))


@pytest.fixture(scope="module")
def solo(lm):
    eng = _engine(lm, compile_solo=True)
    yield eng
    eng.close()


def test_static_cache_sizes():
    assert [columns_for(n, r) for n, r in [(5, 10), (200, 56), (200, 57), (600, 100), (1000, 1000)]] == \
        [256, 256, 512, 1024, 2048]


def test_a_lone_row_decodes_compiled_with_the_trainers_logprobs(solo, lm):
    eager = _engine(lm)
    try:
        want = _one(eager, PROMPT, SamplingParams(max_tokens=30, seed=3))
    finally:
        eager.close()
    before = solo.stats["compiled_steps"]
    g = _one(solo, PROMPT, SamplingParams(max_tokens=30, seed=3))
    assert solo.solo.failed is None
    assert g.token_ids == want.token_ids
    # the first token's logits come from the prefill; each later one from a compiled step
    assert g.metrics["compiled_tokens"] == 29 and solo.stats["compiled_steps"] - before == 29
    assert torch.allclose(_recomputed(lm.model, PROMPT, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(want.logprobs), atol=1e-4)


def test_a_joiner_moves_the_row_back_and_it_returns_when_alone(solo, lm):
    """Row A decodes alone (compiled); B joins (eager, batched); B ends first, A is alone again.
    A's 10th token holds the engine until B is queued, so B joins at A's next step."""
    seen, queued = threading.Event(), threading.Event()

    def watch(_tok, n=[0]):  # noqa: B006 - a counter private to this watch
        n[0] += 1
        if n[0] == 10:
            seen.set()
            assert queued.wait(30)
        return False

    other = [1, 300, 301, 302]

    async def go():
        loop = asyncio.get_running_loop()
        a = asyncio.ensure_future(solo.generate(PROMPT, SamplingParams(max_tokens=120, seed=1), watch))
        await loop.run_in_executor(None, seen.wait)
        b = asyncio.ensure_future(solo.generate(other, SamplingParams(max_tokens=8, seed=2)))
        await asyncio.sleep(0)  # B's request is in the engine's queue
        queued.set()
        return await a, await b

    entries = solo.stats["compiled_entries"]
    a, b = asyncio.run(go())
    assert len(a.token_ids) == 120 and len(b.token_ids) == 8
    # A's token logits: 1 from its prefill, 7 from steps batched (eagerly) with B's tokens 1-7, the rest compiled
    assert a.metrics["compiled_tokens"] == 119 - 7 and b.metrics["compiled_tokens"] == 0
    assert a.metrics["wave_size"] == 2
    assert solo.stats["compiled_entries"] - entries == 2  # alone at the start, alone again after B
    for prompt, g in ((PROMPT, a), (other, b)):
        assert torch.allclose(_recomputed(lm.model, prompt, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)


def test_a_straggler_with_a_hole_in_its_cache_decodes_compiled(solo, lm):
    """Two next turns from kept caches of different lengths run as one wave: the shorter kept cache
    is left-padded and the fewer new tokens leave a masked hole after it. The longer reply's last
    tokens run alone, compiled, from that cache with the hole dropped."""
    p1, p2 = PROMPT, [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]

    async def wave(reqs):
        return await solo.generate_wave([(p, SamplingParams(max_tokens=n, seed=s), None) for p, n, s in reqs])

    g1, g2 = asyncio.run(wave([(p1, 4, 1), (p2, 4, 2)]))
    # t1: 9 kept columns (left-padded to t2's 15), 3 new tokens after a hole of 5 (t2 has 8 new)
    t1, t2 = p1 + g1.token_ids + [1, 7], p2 + g2.token_ids + [1, 7, 8, 9, 10, 11, 12]
    h1, h2 = asyncio.run(wave([(t1, 30, 3), (t2, 6, 4)]))
    assert (h1.metrics["cached_prompt_tokens"], h2.metrics["cached_prompt_tokens"]) == (len(p1) + 3, len(p2) + 3)
    assert h1.metrics["wave_size"] == 2 and h1.metrics["compiled_tokens"] == 29 - 5  # alone after h2's 6th token
    for prompt, g in ((t1, h1), (t2, h2)):
        assert torch.allclose(_recomputed(lm.model, prompt, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)


def test_the_next_turn_reuses_the_compiled_rows_cache(solo, lm):
    g1 = _one(solo, PROMPT, SamplingParams(max_tokens=12, seed=5))
    turn2 = PROMPT + g1.token_ids + [1, 7, 8, 9]
    g2 = _one(solo, turn2, SamplingParams(max_tokens=12, seed=6))
    assert g2.metrics["cached_prompt_tokens"] == len(PROMPT) + len(g1.token_ids) - 1
    assert g2.metrics["compiled_tokens"] == 11
    assert torch.allclose(_recomputed(lm.model, turn2, g2.token_ids), torch.tensor(g2.logprobs), atol=2e-4)


def test_warming_compiles_up_front_and_compiled_steps_see_new_weights(lm):
    eng = _engine(lm, compile_solo=True)
    try:
        assert eng.warm_solo() is None and eng.stats["compiled_steps"] == 0  # compiled, no row's step
        graphs = counters["stats"]["unique_graphs"]
        g = _one(eng, PROMPT, SamplingParams(max_tokens=6, seed=1))  # with the first weights
        assert g.metrics["compiled_tokens"] == 5 and eng.stats["compiled_steps"] == 5
        assert counters["stats"]["unique_graphs"] == graphs  # the warm-up compiled what real rows run
        new = copy.deepcopy(lm.model)
        with torch.no_grad():
            for p in new.parameters():
                p.mul_(1.05)
        eng.load_weights(new.state_dict(), 1)
        g = _one(eng, PROMPT, SamplingParams(max_tokens=20, seed=1))
        assert g.versions == [1] * 20 and g.metrics["compiled_tokens"] == 19
        assert torch.allclose(_recomputed(new, PROMPT, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
        assert not torch.allclose(_recomputed(lm.model, PROMPT, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    finally:
        eng.close()


def test_a_failed_compile_decodes_eagerly(lm, monkeypatch, caplog):
    off = _engine(lm)
    try:
        assert off.warm_solo() == "compile_solo is off"
    finally:
        off.close()
    closed = _engine(lm, compile_solo=True)
    closed.close()
    assert closed.warm_solo() == "the engine is closed"  # answered, not waited for forever

    monkeypatch.setattr(faults, "_plan", faults._parse("engine.compile:raise@1"))
    eng = _engine(lm, compile_solo=True)
    try:
        g = _one(eng, PROMPT, SamplingParams(max_tokens=10, seed=1))
        assert len(g.token_ids) == 10 and g.metrics["compiled_tokens"] == 0
        assert "EngineError" in eng.solo.failed and eng.stats["compiled_steps"] == 0
        assert "compiled decoding is off" in caplog.text
        assert torch.allclose(_recomputed(lm.model, PROMPT, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
        g = _one(eng, PROMPT, SamplingParams(max_tokens=10, seed=1))  # no second try
        assert g.metrics["compiled_tokens"] == 0
    finally:
        eng.close()
