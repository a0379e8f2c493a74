"""The torch engine on the embedded model: batching, sampling, log-probs, versions, pause."""

import asyncio

import pytest
import torch
from conftest import gen_many

from rlonce.engine.base import SamplingParams
from rlonce.engine.rows import Uniforms, draw
from rlonce.engine.torch_engine import TorchEngine, process_logits
from rlonce.train.trainer import token_logprobs


@pytest.fixture
def engine(lm):
    import copy

    eng = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, max_batch_size=16,
                      batch_wait_s=0.05)
    yield eng
    eng.close()


PROMPTS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]


def test_logprobs_match_the_trainers_recomputation(engine, lm):
    """The engine's per-token log-probs are the trainer's log-probs of the same tokens (T=1)."""
    gens = gen_many(engine, PROMPTS, [SamplingParams(max_tokens=12, seed=i) for i in range(4)])
    assert engine.stats["waves"] == 1  # four concurrent requests, one batched wave
    for p, g in zip(PROMPTS, gens):
        ids = torch.tensor([p + g.token_ids])
        lp, _ = token_logprobs(lm.model, ids, torch.ones_like(ids))
        recomputed = lp[0, len(p) - 1:]
        assert torch.allclose(recomputed, torch.tensor(g.logprobs), atol=2e-4), (recomputed, g.logprobs)
        assert g.versions == [0] * len(g.token_ids)
        assert g.finish_reason in {"stop", "length"}
        assert len(g.token_ids) <= 12


def test_seeded_requests_do_not_depend_on_batch_company(engine):
    alone = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=10, seed=7)])[0]
    crowd = gen_many(engine, PROMPTS, [SamplingParams(max_tokens=10, seed=s) for s in (7, 1, 2, 3)])[0]
    assert alone.token_ids == crowd.token_ids


def test_seeded_draws_follow_the_distribution_and_never_pick_a_cut_token():
    """The per-row draw (one uniform through the row's CDF), seeded or not: frequencies match
    the probabilities, a token the top-k/top-p cut (probability 0) never comes, and a row's draws
    depend on its own generator only."""
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    logp = probs.log()
    engine_gen = torch.Generator().manual_seed(0)
    gens = [Uniforms(1), None]
    n = 20000
    draws = torch.stack([draw(logp, gens, engine_gen) for _ in range(n)])
    freq = torch.bincount(draws[:, 0], minlength=5).double() / n
    assert torch.allclose(freq, probs[0].double(), atol=0.015) and freq[1] == 0 and freq[4] == 0
    assert (draws[:, 1] == 4).all()  # the one token left, drawn from the engine's own generator
    first = draw(logp, [Uniforms(1), None], engine_gen)[0]
    assert first == draws[0, 0]  # the same seed, the same first draw, whatever the engine drew before
    unseeded = torch.stack([draw(logp.flip(0), [None, None], engine_gen) for _ in range(n)])
    freq = torch.bincount(unseeded[:, 1], minlength=5).double() / n  # rows without a seed: the engine's draws
    assert torch.allclose(freq, probs[0].double(), atol=0.015) and freq[1] == 0 and freq[4] == 0
    assert (unseeded[:, 0] == 4).all()
    before = engine_gen.get_state()
    draw(logp, [Uniforms(2), Uniforms(3)], engine_gen)
    assert torch.equal(engine_gen.get_state(), before)  # seeded rows only: the engine's stream is left alone


def test_a_rows_uniforms_drawn_in_blocks_are_its_generators_one_at_a_time():
    """A seeded row takes its uniforms 64 at a time: the same numbers, in order, as one
    ``torch.rand`` call per token from a generator of the same seed (what a row drew before)."""
    stream, gen = Uniforms(11), torch.Generator().manual_seed(11)
    one_at_a_time = [float(torch.rand(1, dtype=torch.float64, generator=gen)) for _ in range(3 * Uniforms.block + 5)]
    assert [stream.next() for _ in range(len(one_at_a_time))] == one_at_a_time


def test_top_k_1_is_greedy_and_temperature_changes_logprobs(engine, lm):
    g = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=6, top_k=1)])[0]
    ids = PROMPTS[0] + g.token_ids
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids])).logits[0]
    assert g.token_ids == logits[len(PROMPTS[0]) - 1:-1].argmax(-1).tolist()[: len(g.token_ids)]
    assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in g.logprobs)  # a one-candidate distribution


def test_process_logits_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    one = torch.tensor([1.0])
    lp = process_logits(logits, one, torch.tensor([0]), torch.tensor([0.7]))
    # top-p 0.7 keeps 0.5 and 0.3 (mass before 0.3 is 0.5 < 0.7; before 0.15 is 0.8 >= 0.7)
    assert lp.exp()[0].tolist() == pytest.approx([0.625, 0.375, 0, 0], abs=1e-6)
    lp = process_logits(logits, one, torch.tensor([3]), torch.tensor([1.0]))
    assert lp.exp()[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], abs=1e-6)
    lp = process_logits(logits, torch.tensor([2.0]), torch.tensor([0]), torch.tensor([1.0]))
    p = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    assert lp.exp()[0].tolist() == pytest.approx((p / p.sum()).tolist(), abs=1e-6)


def test_load_weights_stamps_new_version(engine, lm):
    import copy

    other = copy.deepcopy(lm.model)
    with torch.no_grad():
        for p in other.parameters():  # tied embeddings stay tied
            p.add_(0.01 * torch.randn_like(p))
    state = other.state_dict()
    engine.load_weights(state, 5)
    g = gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=4)])[0]
    assert g.versions == [5] * len(g.token_ids)
    assert torch.equal(engine.model.state_dict()["model.embed_tokens.weight"], state["model.embed_tokens.weight"])


def test_pause_aborts_the_running_wave_and_holds_new_ones(engine):
    async def go():
        task = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_tokens=500)))
        await asyncio.sleep(0.3)
        engine.pause()
        first = await task
        held = asyncio.ensure_future(engine.generate([1, 2], SamplingParams(max_tokens=3)))
        await asyncio.sleep(0.2)
        assert not held.done()
        engine.resume()
        return first, await held

    first, second = asyncio.run(go())
    assert first.finish_reason in {"abort", "stop"} and len(first.token_ids) < 500
    assert len(second.token_ids) >= 1


def test_prompt_longer_than_context_is_rejected(engine):
    with pytest.raises(ValueError, match="exceeds the model's context"):
        gen_many(engine, [[1] * 1020], [SamplingParams(max_tokens=10)])


def test_confident_run_stop_rule(engine):
    """M1's stop rule: greedy decoding samples every token with p = 1 > 0.99, so a run limit of 5
    ends the turn after exactly 5 tokens with finish reason "repetition"."""
    from rlonce.algo.penalties import longest_confident_run

    g, free = gen_many(engine, PROMPTS[:2], [SamplingParams(max_tokens=40, top_k=1, stop_confident_run=5),
                                             SamplingParams(max_tokens=40, top_k=1, seed=1)])
    assert (g.finish_reason, len(g.token_ids)) == ("repetition", 5)
    assert longest_confident_run(g.logprobs) == len(g.token_ids)
    assert free.finish_reason in {"stop", "length"}  # the other request of the wave is unaffected
    with pytest.raises(ValueError, match="confident_p"):
        SamplingParams(stop_confident_run=-1)


def test_a_bug_of_ours_in_a_wave_is_not_disguised_as_an_engine_outage(engine):
    """An AttributeError raised by rlonce's own engine code reaches the caller as itself (the
    runner then counts it as internal_error); a failure of the model is an EngineError (an outage)."""
    import types

    from rlonce.engine.base import EngineError
    from rlonce.errors import is_internal

    with pytest.raises(AttributeError) as bug:  # sampling settings without the fields the wave reads
        gen_many(engine, PROMPTS[:1], [types.SimpleNamespace(max_tokens=4)])
    assert is_internal(bug.value)

    def lost(*args, **kwargs):
        raise RuntimeError("CUDA error: device lost")

    engine.model.model.embed_tokens.forward = lost  # the model fails, whichever forward runs it
    with pytest.raises(EngineError, match="RuntimeError: CUDA error: device lost"):
        gen_many(engine, PROMPTS[:1], [SamplingParams(max_tokens=4)])


def test_lockstep_waves_repeat_bit_for_bit_whatever_the_timing(engine):
    """Members with their own seeds and 'tool calls' of random length between turns: under
    Lockstep every turn's wave has the same members in the same order, so tokens and log-probs
    repeat exactly across runs whose timings differ; a member that leaves early or an announced
    sequence that never joins does not stall the others."""
    import random

    from rlonce.engine.lockstep import Lockstep

    async def run(jitter_seed: int):
        ls, rng = Lockstep(engine), random.Random(jitter_seed)
        ticket = ls.reserve(len(PROMPTS) + 1)  # one announced sequence never joins

        async def member(i: int):
            out = []
            async with ticket.member((i,)):
                ctx = list(PROMPTS[i])
                for turn in range(3 - (i == 1)):  # member 1 leaves after two turns
                    await asyncio.sleep(rng.random() * 0.05)  # a tool call
                    g = await ls.generate(ctx, SamplingParams(max_tokens=6, seed=100 * i + turn))
                    out.append((g.token_ids, g.logprobs))
                    ctx = ctx + g.token_ids + [1, 7]
            return out

        tasks = [asyncio.create_task(member(i)) for i in range(len(PROMPTS))]
        await asyncio.sleep(0.02)
        ticket.release()  # the fifth never came
        return await asyncio.gather(*tasks), ls.waves

    first, waves = asyncio.run(run(1))
    again, waves_again = asyncio.run(run(2))
    assert first == again  # floats compared exactly
    assert waves == waves_again == 3  # one wave per turn: all four together, then three
    assert [len(x) for x in first] == [3, 2, 3, 3]
