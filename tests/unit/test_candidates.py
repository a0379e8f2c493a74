"""Top-k/top-p candidate sets: recorded by the engine, carried by the records, renormalised over
by the trainer (seed 000: "top-p candidate sets recorded during rollout are used to renormalize
training log-probabilities")."""

import asyncio
import copy
import itertools
import json
import math

import pytest
import torch

from rlonce.core.records import (
    Context,
    RecordError,
    Role,
    Segment,
    Sequence,
    TrainingRow,
    sequence_from_dict,
    sequence_to_dict,
    sequence_to_rows,
)
from rlonce.engine.base import SamplingParams
from rlonce.engine.torch_engine import TorchEngine, process_logits
from rlonce.model.logits import token_logprobs_over
from rlonce.train.trainer import OptimSettings, Trainer, pad_rows, token_logprobs

P = [0.5, 0.3, 0.15, 0.05]


def _logits(temperature=1.0):
    return torch.log(torch.tensor([P] * 6)) / temperature


def test_renormalisation_over_the_top_k_logits_hand_computed():
    tokens = torch.tensor([1, 0, 1, 3, 0, 2])
    sizes = torch.tensor([2, 2, 0, 3, 1, 4])
    lp, ent = token_logprobs_over(_logits(), tokens, sizes, with_entropy=True)
    assert lp.tolist() == pytest.approx([math.log(0.3 / 0.8), math.log(0.5 / 0.8), math.log(0.3),
                                         math.log(0.05 / 0.95),  # outside its set of 3: finite, not -inf
                                         0.0, math.log(0.15)], abs=1e-6)
    h2 = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))  # {0.5, 0.3} renormalised
    h_all = -sum(p * math.log(p) for p in P)
    h3 = -sum(p / 0.95 * math.log(p / 0.95) for p in P[:3])
    assert ent.tolist() == pytest.approx([h2, h2, h_all, h3, 0.0, h_all], abs=1e-6)
    assert h2 == pytest.approx(0.661563, abs=1e-6)


def test_renormalisation_divides_by_the_temperature_first():
    lp, _ = token_logprobs_over(_logits(2.0)[:1], torch.tensor([1]), torch.tensor([2]))
    q = math.sqrt(0.3) / (math.sqrt(0.5) + math.sqrt(0.3))  # p^(1/T) over the set, T = 2
    assert float(lp[0]) == pytest.approx(math.log(q), abs=1e-6)


def test_gradient_moves_only_the_candidates():
    logits = torch.log(torch.tensor([P])).requires_grad_()
    lp, _ = token_logprobs_over(logits, torch.tensor([1]), torch.tensor([2]))
    lp.sum().backward()
    # d log q(1) / d logit = onehot(1) - q over the set {0, 1}; tokens outside it get nothing
    assert logits.grad[0].tolist() == pytest.approx([-0.625, 0.625, 0.0, 0.0], abs=1e-6)


def test_engine_set_sizes_are_what_top_k_and_top_p_keep():
    logits = torch.log(torch.tensor([P, P, P]))
    lp = process_logits(logits, torch.ones(3), torch.tensor([0, 3, 0]), torch.tensor([0.7, 1.0, 0.9]))
    # top-p 0.7 keeps {0.5, 0.3}; top-k 3 keeps three; top-p 0.9 keeps {0.5, 0.3, 0.15} (0.8 < 0.9)
    assert lp.isfinite().sum(-1).tolist() == [2, 3, 3]


def test_records_check_and_carry_candidate_sets():
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [4, 5], [-0.5, -0.2], [0, 0], candidates=[3])
    with pytest.raises(RecordError):
        Segment(Role.MODEL, [4], [-0.5], [0], candidates=[-1])
    with pytest.raises(RecordError):
        Segment(Role.OBSERVATION, [4], candidates=[2])
    with pytest.raises(RecordError):
        TrainingRow([1, 2, 3], [0, 1, 1], [0, -1, -1], [0, 1, 1], [-1, 0, 0], candidates=[0, 2])
    ctx = Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [3, 4], [-0.5, -0.25], [0, 0], "stop",
                                                         candidates=[2, 7]),
                   Segment(Role.OBSERVATION, [5]), Segment(Role.MODEL, [6], [-1.0], [1])])  # the last: no cut
    seq = Sequence("t", "a", [ctx], reward=1.0)
    back = sequence_from_dict(json.loads(json.dumps(sequence_to_dict(seq))))
    assert [s.candidates for s in back.contexts[0].segments] == [None, [2, 7], None, None]
    (row,) = sequence_to_rows(back, 1.0)
    assert row.candidates == [0, 0, 2, 7, 0, 0]
    assert pad_rows([row]).cand_BT.tolist() == [[0, 2, 7, 0, 0]]  # shifted: position t is token t+1
    old = sequence_to_dict(seq)
    for s in old["contexts"][0]["segments"]:
        del s["candidates"]  # a checkpoint written before candidate sets existed
    (row,) = sequence_to_rows(sequence_from_dict(old), 1.0)
    assert row.candidates is None and pad_rows([row]).cand_BT is None


@pytest.fixture(scope="module")
def lm64(lm):
    """The embedded model in float64: engine and trainer then agree to float32 rounding, so what is
    left of the ratio is the renormalisation (float32 kernels add ~1e-5 of their own)."""
    m = copy.deepcopy(lm.model).double()
    return m


GRID = list(itertools.product([0.5, 0.7, 0.9, 1.0], [0, 5, 50]))
PROMPTS = [[1, 50, 60, 70], [1, 80], [1, 90, 91, 92, 93, 94, 95], [1, 100, 101]]


def _rollout_rows(lm, model, temperature):
    engine = TorchEngine(copy.deepcopy(model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, max_batch_size=64)

    async def go():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=24, temperature=temperature,
                                                                        top_p=tp, top_k=tk, seed=i))
                                      for i, (tp, tk) in enumerate(GRID) for p in PROMPTS))
    try:
        gens = asyncio.run(go())
    finally:
        engine.close()
    rows = []
    for i, g in enumerate(gens):
        assert (g.candidates is None) == (GRID[i // len(PROMPTS)] == (1.0, 0))
        seg = Segment(Role.MODEL, g.token_ids, g.logprobs, g.versions, g.finish_reason, candidates=g.candidates,
                      temperature=temperature)
        seq = Sequence("t", "a", [Context([Segment(Role.PROMPT, PROMPTS[i % len(PROMPTS)]), seg])])
        rows += sequence_to_rows(sequence_from_dict(sequence_to_dict(seq)), 1.0, group_id=f"g{i}")
    return [rows[k * len(PROMPTS):(k + 1) * len(PROMPTS)] for k in range(len(GRID))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@torch.no_grad()
def test_identical_weights_give_ratio_one_for_any_top_p_and_top_k(lm, lm64, temperature):
    trainer = Trainer(lm64, OptimSettings())  # each row carries its temperature
    for (top_p, top_k), rows in zip(GRID, _rollout_rows(lm, lm64, temperature)):
        b = pad_rows(rows)
        sel = b.mask_BT > 0
        recomputed = trainer._recompute(rows)  # rollout correction's π_old: the masked-head path
        ratios = {
            "full": token_logprobs(lm64, b.ids_BT, b.attn_BT, temperature, cand_BT=b.cand_BT)[0][sel],
            "masked": token_logprobs(lm64, b.ids_BT, b.attn_BT, temperature, mask_BT=b.mask_BT,
                                     cand_BT=b.cand_BT)[0][sel],
            "recompute": torch.cat([lp[m[: len(lp)] > 0] for lp, m in zip(recomputed, b.mask_BT)]),
        }
        for path, lp in ratios.items():
            r = (lp - b.old_lp_BT[sel]).exp()
            assert abs(float(r.mean()) - 1) < 1e-5 and abs(float(r.min()) - 1) < 1e-5, (top_p, top_k, path)
            assert abs(float(r.max()) - 1) < 1e-5, (top_p, top_k, path)
        if (top_p, top_k) == (0.5, 0):  # the defect: a full-vocabulary log-softmax underestimates π
            full = token_logprobs(lm64, b.ids_BT, b.attn_BT, temperature)[0][sel]
            assert float((full - b.old_lp_BT[sel]).exp().min()) < 0.9


def test_set_size_from_the_top_processed_logprobs_an_engine_returns():
    from rlonce.engine.base import candidate_size

    inf = float("-inf")
    assert candidate_size([-0.47, -0.98, inf, inf], 4, 0) == 2  # two finite of four asked: the whole set
    assert candidate_size([-1.0, -2.0, -3.0, -4.0], 4, 0) == 0  # all four finite: the set may be larger
    assert candidate_size([-1.0, -2.0, -3.0, -4.0], 4, 4) == 4  # ... unless top-k caps it at four
    assert candidate_size([-1.0, -2.0, -3.0, -4.0, -5.0], 4, 0) == 0  # the sampled token beyond the four


def test_gateway_checkpoint_and_ray_payloads_carry_the_sets(lm):
    """The gateway puts the engine's sizes and the temperature it sampled at on the model segment
    and in its export; a waiting group's checkpoint form and a pickled (Ray) payload bring them back
    unchanged."""
    import pickle
    from dataclasses import asdict

    from rlonce.gateway.core import Gateway
    from rlonce.gateway.session import GatewaySettings
    from rlonce.model.chat import get_format
    from rlonce.rollout.groups import Group, replayed_group, waiting_state

    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0, seed=0)
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=get_format(lm.chat_format),
                                 sampling=SamplingParams(max_tokens=16, top_p=0.9, temperature=0.7)))
    try:
        s = gw.open("c")
        asyncio.run(gw.call("openai-chat", {"messages": [{"role": "system", "content": "s"},
                                                         {"role": "user", "content": "list the files"}]}, "c"))
    finally:
        engine.close()
    (seg,) = [g for g in s.contexts[0].segments if g.role is Role.MODEL]
    assert seg.candidates == s.generations[-1].candidates and len(seg.candidates) == len(seg.token_ids)
    assert min(seg.candidates) >= 1  # every sampled token was one of its own candidates
    exported = json.loads(json.dumps(s.export()))
    assert [(g["candidates"], g["temperature"]) for g in exported["contexts"][0]["segments"]
            if g["role"] == "model"] == [(seg.candidates, 0.7)]
    seq = Sequence("t", "a", list(s.contexts), reward=1.0)
    rows = sequence_to_rows(seq, 0.5, group_id="g")
    group = Group("g", None, "src", 3, 0, state="finished", sequences=[seq], rows=rows, accepted=True)
    back = replayed_group(json.loads(json.dumps(waiting_state(group))), lambda source, index: None, 0)
    assert back.rows == rows and back.sequences[0].contexts[0].segments[-1].candidates == seg.candidates
    assert pickle.loads(pickle.dumps(rows)) == rows and TrainingRow(**asdict(rows[0])) == rows[0]
    assert rows[0].candidates[-len(seg.candidates):] == seg.candidates
    assert seg.temperature == rows[0].temperature == back.sequences[0].contexts[0].segments[-1].temperature == 0.7


def test_harness_candidate_sets_off_records_nothing(lm):
    """``harness.candidate_sets = false`` (to measure what renormalising buys): the run's sampling
    still cuts at top_p, but no sizes are recorded and the trainer normalises over the vocabulary."""
    from dataclasses import replace

    from rlonce.config import load_config
    from rlonce.rollout.builders import rollout_spec
    from rlonce.rollout.sources import build_sources, plan_sources

    def sampling(*overrides):
        cfg = load_config(None, list(overrides))
        (src,) = build_sources(plan_sources(cfg), rollout_spec(cfg, lm)).values()
        return src.spec.sampling

    on = sampling("harness.top_p=0.9")
    off = sampling("harness.top_p=0.9", "harness.candidate_sets=false")
    assert on.records_candidates and not off.records_candidates and off.top_p == 0.9
    engine = TorchEngine(copy.deepcopy(lm.model), eos_token_ids=lm.eos_token_ids, pad_token_id=0)

    async def go():
        return await asyncio.gather(*(engine.generate([1, 50, 60], replace(s, max_tokens=4, seed=1))
                                      for s in (on, off)))
    try:
        g_on, g_off = asyncio.run(go())
    finally:
        engine.close()
    assert len(g_on.candidates) == len(g_on.token_ids) and g_off.candidates is None


class _PausesOnce(torch.nn.Module):
    """The embedded model, which pauses its engine at its third forward pass (as a weight update
    does) and resumes it 0.1 s later: the turn in flight ends 'abort' and the gateway continues it."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config, self.calls, self.engine = model, model.config, 0, None

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0):
        import threading

        self.calls += 1
        if self.calls == 3:
            self.engine.pause()
            threading.Timer(0.1, self.engine.resume).start()
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep)


@torch.no_grad()
def test_a_turn_continued_after_a_pause_keeps_every_tokens_set(lm, lm64):
    from rlonce.gateway.core import Gateway
    from rlonce.gateway.session import GatewaySettings, session_metrics
    from rlonce.model.chat import get_format

    model = _PausesOnce(copy.deepcopy(lm64))
    engine = model.engine = TorchEngine(model, eos_token_ids=[], pad_token_id=0, seed=0)  # no EOS: 12 tokens
    gw = Gateway(GatewaySettings(engine=engine, encode=lm.encode, decode=lm.decode, fmt=get_format(lm.chat_format),
                                 sampling=SamplingParams(max_tokens=12, top_p=0.8, top_k=40)))
    try:
        s = gw.open("c")
        asyncio.run(gw.call("openai-chat", {"messages": [{"role": "user", "content": "list the files"}],
                                            "max_tokens": 12}, "c"))
    finally:
        engine.close()
    assert s.interrupts == 1
    # both prefills count: the prompt, then the prompt and the tokens sampled before the pause; an
    # aborted turn's cache is not kept, so the continuation reuses nothing
    m, n = session_metrics(s), s.prompt_tokens
    assert 2 * n < m["prompt_tokens"] < 2 * n + 12 and m["cached_prompt_tokens"] == 0
    (row,) = sequence_to_rows(Sequence("t", "a", list(s.contexts)), 1.0)
    (seg,) = [g for g in s.contexts[0].segments if g.role is Role.MODEL]
    assert len(seg.token_ids) == 12 and len(seg.candidates) == 12 and min(seg.candidates) >= 1
    b = pad_rows([row])
    lp, _ = token_logprobs(lm64, b.ids_BT, b.attn_BT, mask_BT=b.mask_BT, cand_BT=b.cand_BT)
    sel = b.mask_BT > 0
    assert (lp[sel] - b.old_lp_BT[sel]).abs().max() < 1e-5
