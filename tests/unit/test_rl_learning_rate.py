"""The RL learning rate: a source's own (``[[sources]] lr``) and the schedule (``rl.lr_schedule``).

A source's rate is resolved once in the plan as its ratio to ``rl.lr``, carried by its rows
(``TrainingRow.lr_scale``), and kept apart by the trainer — rows of two rates never share a
mini-batch, and each mini-batch's optimizer step runs at the schedule's rate times its scale.
Checked by hand: the split, the rates the optimizer stepped at, and the first Adam step's size
(lr · scale per weight: bias-corrected, m̂/√v̂ = g/|g| = ±1)."""

import copy

import pytest
import torch

from rlonce.algo.signal import SignalSettings, learning_signal
from rlonce.config import AlgoConfig, load_config, objective_params
from rlonce.core.records import Context, Role, Sample, Segment, Sequence, TrainingRow
from rlonce.rollout.builders import signal_settings
from rlonce.rollout.sources import plan_sources
from rlonce.train.minibatch import minibatch_splits, scaled_splits
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs

LR = 1e-3


def test_each_scale_is_split_on_its_own_and_scales_come_in_ascending_order():
    # groups a, b at scale 10 and c, d at scale 1, two rows each, interleaved
    group_ids = ["a", "c", "a", "c", "b", "d", "b", "d"]
    scales = [10, 1, 10, 1, 10, 1, 10, 1]
    lengths = [5, 4, 5, 4, 6, 9, 6, 9]
    # one mini-batch asked: one per scale, the lower scale first, rows in order
    assert scaled_splits(group_ids, lengths, scales, 1, seed=0) == [([1, 3, 5, 7], 1.0), ([0, 2, 4, 6], 10.0)]
    for seed in range(5):  # two asked: each scale's two groups, one per mini-batch (in the seed's order)
        splits = scaled_splits(group_ids, lengths, scales, 2, seed=seed)
        assert [s for _, s in splits] == [1.0, 1.0, 10.0, 10.0]
        assert sorted(tuple(idx) for idx, _ in splits) == [(0, 2), (1, 3), (4, 6), (5, 7)]
        assert all({scales[i] for i in idx} == {scale} for idx, scale in splits)
    # one scale: the plain split, each mini-batch at scale 1
    plain = minibatch_splits(["a", "a", "b"], [1, 1, 1], 4, seed=3)
    assert scaled_splits(["a", "a", "b"], [1, 1, 1], [1, 1, 1], 4, seed=3) == [(s, 1.0) for s in plain]


def _rows(lm, scales: list[float]) -> list[TrainingRow]:
    """One two-row group per scale: advantages +1 and −1, rollout log-probs the model's own (so
    PPO's ratio is 1 and every trained token has a gradient)."""
    rows = []
    for k, scale in enumerate(scales):
        for j in range(2):
            ids = [(7 * k + 3 * j + 5 * t) % 500 + 10 for t in range(10)]
            mask = [0, 0] + [1] * 8
            with torch.no_grad():
                lp = token_logprobs(lm.model, torch.tensor([ids]), torch.ones(1, 10, dtype=torch.long))[0][0]
            roll = [0.0] + [x * m for x, m in zip(lp.tolist(), mask[1:])]
            rows.append(TrainingRow(ids, mask, roll, [(1.0 - 2 * j) * m for m in mask],
                                    [0 if m else -1 for m in mask], group_id=f"g{k}", lr_scale=scale))
    return rows


def _request(minibatches: int) -> RLRequest:
    return RLRequest(objective="ppo", params=objective_params(AlgoConfig()), agg="token-mean", correction="none",
                     correction_cap=2.0, geometric_bounds=(0.999, 1.001), kl_coef=0.0, topk_weight=0.0,
                     routing_replay=True, qdq_align=False, minibatches=minibatches)


def test_the_trainer_steps_each_scales_mini_batches_at_its_rate(lm):
    tr = Trainer(copy.deepcopy(lm.model), OptimSettings(lr=LR))
    rates, step = [], tr.optimizer.step

    def recorded():
        rates.append(tr.optimizer.param_groups[0]["lr"])
        step()

    tr.optimizer.step = recorded
    out = tr.rl_step(_rows(lm, [1.0, 10.0, 1.0, 10.0]), _request(2))
    assert rates == pytest.approx([LR, LR, 10 * LR, 10 * LR])  # two mini-batches per scale, the lower first
    assert out["lr"] == LR and out["optimizer_steps"] == 4  # the schedule's rate; a source's scale multiplies it
    rates.clear()
    tr.rl_step(_rows(lm, [1.0, 1.0]), _request(2))
    assert rates == pytest.approx([LR, LR])  # every source at rl.lr: as before


def test_the_first_adam_step_of_a_scaled_mini_batch_moves_each_weight_by_lr_times_its_scale(lm):
    model = copy.deepcopy(lm.model)
    before = model.model.embed_tokens.weight.detach().clone()
    tr = Trainer(model, OptimSettings(lr=LR, eps=1e-12))
    grads = []
    tr.optimizer.step = (lambda s=tr.optimizer.step: (grads.append(model.model.embed_tokens.weight.grad.clone()),
                                                      s()))
    tr.rl_step(_rows(lm, [4.0]), _request(1))
    moved = (model.model.embed_tokens.weight.detach() - before).abs()
    live = grads[0].abs() > 1e-6
    assert live.sum() > 100
    assert torch.allclose(moved[live], torch.full_like(moved[live], 4 * LR), rtol=1e-3)
    assert float(moved[~live].max()) <= 4 * LR * (1 + 1e-3)


MIXED = """
[rl]
lr = 2e-4
[[sources]]
name = "toolfind"
[[sources]]
name = "reasoning"
label = "bits"
arms = ["single-turn"]
lr = 2e-3
"""


def test_a_sources_lr_is_resolved_once_as_a_scale_and_lands_on_its_rows(tmp_path, lm):
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED)
    plans = {p.label: p for p in plan_sources(load_config(f, []))}
    assert plans["toolfind"].lr_scale == 1.0 and plans["bits"].lr_scale == pytest.approx(10.0)
    settings = signal_settings(AlgoConfig(), plans.values())
    assert settings.lr_scale == {"bits": pytest.approx(10.0)}

    def group(source: str) -> Sample:
        def seq(r):
            ids = lm.encode("What is it? 3")
            return Sequence("t", "single-turn", [Context([Segment(Role.PROMPT, ids[:-1]),
                                                          Segment(Role.MODEL, ids[-1:], [-0.5], [0], "stop")])],
                            reward=r)
        return Sample("t", source, 0, [seq(1.0), seq(0.0)])

    rows, _, _ = learning_signal([group("toolfind"), group("bits")], 1, settings, decode=lm.decode)
    assert [r.lr_scale for r in rows] == [1.0, 1.0, pytest.approx(10.0), pytest.approx(10.0)]
    assert all(r.lr_scale == 1.0 for r in learning_signal([group("bits")], 1, SignalSettings())[0])


def test_rl_lr_schedule_cosine_decays_to_a_tenth_over_the_runs_optimizer_steps(lm):
    """``rl.lr_schedule = "cosine"``: lr · (0.1 + 0.45 · (1 + cos(π · k / K))) at optimizer step k
    after warm-up, K = steps × minibatches, then 10 % (by hand: 1, 0.55 at the half, 0.1)."""
    from rlonce.config import RLConfig
    from rlonce.train.builders import optim_settings

    cfg = RLConfig(lr=LR, steps=10, minibatches=2, lr_schedule="cosine")
    assert optim_settings(cfg).total_steps == 20 and optim_settings(RLConfig(steps=10)).total_steps == 0
    tr = Trainer(copy.deepcopy(lm.model), optim_settings(cfg))
    assert [tr.lr_at(k) for k in (0, 10, 20, 35)] == pytest.approx([LR, 0.55 * LR, 0.1 * LR, 0.1 * LR])
    flat = Trainer(copy.deepcopy(lm.model), optim_settings(RLConfig(lr=LR, steps=10)))
    assert [flat.lr_at(k) for k in (0, 10, 35)] == [LR, LR, LR]
