"""The torch engine's prefix reuse and continuous batching, on the embedded model: what is reused,
what joins when, and that the log-probs stay the trainer's."""

import asyncio
import copy
import threading

import pytest
import torch

from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine
from rlonce.train.trainer import token_logprobs

PROMPT = [1, 50, 60, 70, 80, 90]
OBS = [1, 7, 8, 9]  # a tool's answer appended after the reply


def _engine(lm, **kw):
    return TorchEngine(copy.deepcopy(lm.model), eos_token_ids=kw.pop("eos", lm.eos_token_ids), pad_token_id=0,
                       max_batch_size=16, batch_wait_s=0.01, **kw)


def _recomputed(lm, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
    return lp[0, len(prompt) - 1:]


def _one(engine, prompt, sampling):
    return asyncio.run(engine.generate(prompt, sampling))


def test_the_next_turn_runs_the_model_on_its_new_tokens_only(lm):
    eng = _engine(lm)
    try:
        g1 = _one(eng, PROMPT, SamplingParams(max_tokens=12, seed=1))
        assert g1.metrics["cached_prompt_tokens"] == 0 and eng.stats["prefill_tokens"] == len(PROMPT)
        turn2 = PROMPT + g1.token_ids + OBS
        g2 = _one(eng, turn2, SamplingParams(max_tokens=12, seed=2))
        seen = len(PROMPT) + len(g1.token_ids) - 1  # the last sampled token was never run
        assert g2.metrics["cached_prompt_tokens"] == seen
        assert eng.stats["prefill_tokens"] == len(PROMPT) + len(turn2) - seen  # 1 + len(OBS) new tokens
        assert eng.stats["prefix_hits"] == 1 and eng.stats["prefix_stored"] == 2
        assert torch.allclose(_recomputed(lm, turn2, g2.token_ids), torch.tensor(g2.logprobs), atol=2e-4)
        # turn 2's kept cache covers turn 1's, which was dropped as redundant
        assert len(eng.prefixes) == 1
    finally:
        eng.close()


def test_a_shared_prompt_is_reused_in_part_and_a_weight_load_drops_every_kept_cache(lm):
    eng = _engine(lm)
    try:
        g1 = _one(eng, PROMPT, SamplingParams(max_tokens=6, seed=1))
        other = PROMPT[:4] + [300, 301]  # shares four tokens with the first prompt
        g2 = _one(eng, other, SamplingParams(max_tokens=6, seed=3))
        assert g2.metrics["cached_prompt_tokens"] == 4
        assert torch.allclose(_recomputed(lm, other, g2.token_ids), torch.tensor(g2.logprobs), atol=2e-4)
        eng.load_weights(copy.deepcopy(lm.model).state_dict(), 1)
        assert len(eng.prefixes) == 0
        g3 = _one(eng, PROMPT + g1.token_ids + OBS, SamplingParams(max_tokens=4, seed=2))
        assert g3.metrics["cached_prompt_tokens"] == 0 and g3.versions == [1] * len(g3.token_ids)
    finally:
        eng.close()


def test_reuse_off_prefills_everything(lm):
    eng = _engine(lm, prefix_cache_mb=0)
    try:
        g1 = _one(eng, PROMPT, SamplingParams(max_tokens=6, seed=1))
        turn2 = PROMPT + g1.token_ids + OBS
        g2 = _one(eng, turn2, SamplingParams(max_tokens=6, seed=2))
        assert g2.metrics["cached_prompt_tokens"] == 0
        assert eng.stats["prefill_tokens"] == len(PROMPT) + len(turn2) and "prefix_hits" not in eng.stats
    finally:
        eng.close()


async def _long_then_short(eng):
    """A 60-token request; once it has sampled 5 tokens, a 4-token one. Returns both generations
    and the order in which they were answered."""
    started = threading.Event()
    count = [0]

    def watch(_tok):
        count[0] += 1
        if count[0] == 5:
            started.set()
        return False

    done = []

    async def run(prompt, s, w=None, name=""):
        g = await eng.generate(prompt, s, w)
        done.append(name)
        return g

    long = asyncio.create_task(run(PROMPT, SamplingParams(max_tokens=60, seed=1), watch, "long"))
    while not started.is_set():
        await asyncio.sleep(0.001)
    short = await run([1, 200, 201], SamplingParams(max_tokens=4, seed=2), None, "short")
    return await long, short, done


@pytest.mark.parametrize("continuous", [True, False])
def test_a_request_joins_the_running_batch_and_a_finished_row_is_answered_at_once(lm, continuous):
    eng = _engine(lm, eos=[], continuous=continuous)  # no end token: the long one samples all 60
    try:
        long, short, done = asyncio.run(_long_then_short(eng))
        assert len(long.token_ids) == 60 and len(short.token_ids) == 4
        if continuous:
            assert done == ["short", "long"] and eng.stats["joined"] == 1 and eng.stats["waves"] == 1
            assert short.metrics["wave_size"] == 2
        else:  # waves: the short one waits for the long one's wave to end, then has its own
            assert done == ["long", "short"] and eng.stats["joined"] == 0 and eng.stats["waves"] == 2
        for prompt, g in (([1, 200, 201], short), (PROMPT, long)):
            assert torch.allclose(_recomputed(lm, prompt, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    finally:
        eng.close()


def test_joined_rows_with_kept_prefixes_and_compaction_keep_the_trainers_logprobs(lm):
    """Eight two-turn sessions arriving staggered: rows join mid-batch, reuse their first turn and
    leave through compaction; every token's log-prob is still the trainer's."""
    eng = _engine(lm)

    async def session(i):
        await asyncio.sleep(0.004 * i)
        p = [1, 40 + i, 60, 70 + i]
        g1 = await eng.generate(p, SamplingParams(max_tokens=4 + 3 * i, seed=i))
        await asyncio.sleep(0.003 * (8 - i))  # a tool call
        p2 = p + g1.token_ids + OBS
        g2 = await eng.generate(p2, SamplingParams(max_tokens=10, seed=100 + i))
        return (p, g1), (p2, g2)

    async def go():
        return await asyncio.gather(*(session(i) for i in range(8)))

    try:
        turns = [t for pair in asyncio.run(go()) for t in pair]
        assert eng.stats["prefix_hits"] >= 8 and eng.stats["joined"] >= 1
        for prompt, g in turns:
            assert torch.allclose(_recomputed(lm, prompt, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    finally:
        eng.close()


def test_turns_with_kept_prefixes_of_different_lengths_are_prefilled_together(lm):
    """Two sessions' next turns arrive at once: one forward runs both on their new tokens after
    their kept caches (a masked hole between the shorter cache and its new tokens); the cache kept
    from that batch — holes left out — serves a third turn, and every log-prob is the trainer's."""
    from conftest import gen_many

    eng = _engine(lm)
    try:
        firsts = [[1, 50, 60], [1, 80, 81, 82, 83, 84, 85, 86, 87]]
        g1 = gen_many(eng, firsts, [SamplingParams(max_tokens=n, seed=i) for i, n in enumerate((3, 9))])
        seconds = [p + g.token_ids + OBS for p, g in zip(firsts, g1)]
        prefills = eng.stats["prefill_tokens"]
        g2 = gen_many(eng, seconds, [SamplingParams(max_tokens=5, seed=10 + i) for i in range(2)])
        assert [g.metrics["cached_prompt_tokens"] for g in g2] == [len(p) + len(g.token_ids) - 1
                                                                   for p, g in zip(firsts, g1)]
        assert eng.stats["prefill_tokens"] - prefills == 2 * (1 + len(OBS)) and eng.stats["waves"] == 2
        thirds = [p + g.token_ids + OBS for p, g in zip(seconds, g2)]
        g3 = gen_many(eng, thirds, [SamplingParams(max_tokens=5, seed=20 + i) for i in range(2)])
        assert [g.metrics["cached_prompt_tokens"] for g in g3] == [len(p) + len(g.token_ids) - 1
                                                                   for p, g in zip(seconds, g2)]
        for prompts, gens in ((seconds, g2), (thirds, g3)):
            for p, g in zip(prompts, gens):
                assert torch.allclose(_recomputed(lm, p, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    finally:
        eng.close()


def test_equal_prompts_in_a_batch_are_prefilled_once_and_each_sample_keeps_the_trainers_logprobs(lm):
    """A group's samples share their prompt: it runs once, the others read its cache."""
    eng = _engine(lm, prefix_cache_mb=0)
    other = [1, 40, 41, 42]
    prompts = [PROMPT] * 4 + [other] * 2
    try:
        gens = asyncio.run(eng.generate_wave([(p, SamplingParams(max_tokens=8, seed=10 + i), None)
                                              for i, p in enumerate(prompts)]))
        assert eng.stats["prefill_tokens"] == len(PROMPT) + len(other)
        assert [g.metrics["cached_prompt_tokens"] for g in gens] == [0, 6, 6, 6, 0, 4]
        assert len({tuple(g.token_ids) for g in gens[:4]}) > 1  # the samples went their own ways
        for p, g in zip(prompts, gens):
            assert torch.allclose(_recomputed(lm, p, g.token_ids), torch.tensor(g.logprobs), atol=2e-4)
    finally:
        eng.close()
