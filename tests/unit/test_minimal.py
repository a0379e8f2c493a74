"""The teaching loop (``recipes/minimal.py``) writes its advantages and loss inline; they must
equal the library's ``learning_signal`` and ``policy_loss`` under the main job's defaults."""

import random

import pytest
import torch

from rlonce.algo.losses import policy_loss
from rlonce.algo.signal import learning_signal
from rlonce.config import RunConfig, objective_params
from rlonce.core.records import Context, FailureCategory, Role, Sample, Segment, Sequence, Status
from rlonce.recipes import minimal
from rlonce.rollout.builders import signal_settings
from rlonce.train.trainer import pad_rows


def _seq(task, reward, rng, *, infra=False, hack=False):
    prompt = Segment(Role.PROMPT, [rng.randrange(100) for _ in range(rng.randint(3, 6))])
    n = rng.randint(2, 7)
    model = Segment(Role.MODEL, [rng.randrange(100) for _ in range(n)], [-rng.random() for _ in range(n)], [0] * n)
    status, failure = (Status.INFRA, FailureCategory.SANDBOX_ERROR) if infra else (Status.SUBMITTED, None)
    return Sequence(task, "mini-bash", [Context([prompt, model])], status, failure,
                    reward=None if infra else reward, hack_confirmed=hack)


def _samples(rng):
    return [
        Sample("a", "toolfind", 1, [_seq("a", r, rng) for r in (1.0, 0.0, 1.0, 0.0)] + [_seq("a", 0, rng, infra=True)]),
        Sample("b", "toolfind", 1, [_seq("b", 1.0, rng) for _ in range(4)]),  # no contrast: dropped
        Sample("c", "toolfind", 1, [_seq("c", 1.0, rng, hack=True), _seq("c", 1.0, rng), _seq("c", 0.0, rng)]),
    ]


def _key(row):
    return row.group_id, tuple(row.token_ids)


def test_inline_advantages_equal_the_learning_signal():
    cfg = RunConfig()
    samples = _samples(random.Random(0))
    lib, _, _ = learning_signal(samples, 1, signal_settings(cfg.algo), decode=lambda ids: " ".join(map(str, ids)))
    mine = minimal.grpo_rows(samples)
    assert sorted(map(_key, mine)) == sorted(map(_key, lib)) and len(mine) == 7  # 4 of a, 3 of c
    by_key = {_key(r): r for r in lib}
    for r in mine:
        assert r.advantages == pytest.approx(by_key[_key(r)].advantages, abs=1e-6)  # the library works in float32
        assert r.loss_mask == by_key[_key(r)].loss_mask
    # hand-computed: group a's mean is 0.5; in c the hack scores 0, mean 1/3
    adv = sorted((r.group_id, round(max(r.advantages, key=abs), 9)) for r in mine)
    assert adv == [("toolfind:a@1", -0.5), ("toolfind:a@1", -0.5), ("toolfind:a@1", 0.5), ("toolfind:a@1", 0.5),
                   ("toolfind:c@1", round(-1 / 3, 9)), ("toolfind:c@1", round(-1 / 3, 9)),
                   ("toolfind:c@1", round(2 / 3, 9))]


def test_inline_clipped_loss_equals_policy_loss_with_the_config_defaults():
    cfg = RunConfig()
    obj = cfg.algo.objective
    assert (obj.name, obj.clip_low, obj.clip_high, obj.clip_c) == (
        "ppo", minimal.CLIP_LOW, minimal.CLIP_HIGH, minimal.CLIP_C)
    assert (cfg.rl.group_size, cfg.rl.lr, cfg.rl.minibatches) == (minimal.GROUP, minimal.RL_LR, minimal.MINIBATCHES)
    b = pad_rows(minimal.grpo_rows(_samples(random.Random(1))))
    g = torch.Generator().manual_seed(0)
    # ratios from 0.2 to 5: every branch (clip low, clip high, dual clip) is taken
    lp_BT = (b.old_lp_BT + (torch.rand(b.old_lp_BT.shape, generator=g) * 3.2 - 1.6)) * b.mask_BT
    lib, _ = policy_loss("ppo", lp_BT, b.old_lp_BT, b.adv_BT, b.mask_BT, agg="token-mean",
                         **objective_params(cfg.algo))
    mine = minimal.clipped_loss(lp_BT, b.old_lp_BT, b.adv_BT, b.mask_BT, int(b.mask_BT.sum()))
    assert torch.allclose(mine, lib, atol=1e-6, rtol=1e-6), (float(mine), float(lib))
