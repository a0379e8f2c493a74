"""The trainer's rollout correction on real rows: masked tokens leave the loss and its denominators."""

import copy

import pytest
import torch

from rlonce.config import AlgoConfig, objective_params
from rlonce.core.records import TrainingRow
from rlonce.train.request import RLRequest
from rlonce.train.trainer import OptimSettings, Trainer, token_logprobs


def _rows(lm, shift_first: float, masked: set[tuple[int, int]] = frozenset()) -> list[TrainingRow]:
    """Two rows (9 and 12 tokens, 7 and 10 trained) with rollout log-probs equal to the model's,
    except row 0's first three trained tokens, made ``shift_first`` nats less likely at rollout.
    ``masked``: (row, position) pairs given no loss."""
    out = []
    for b, n in enumerate((9, 12)):
        ids = [(5 * b + 3 * t) % 700 + 10 for t in range(n)]
        mask = [0 if t < 2 or (b, t) in masked else 1 for t in range(n)]
        with torch.no_grad():
            lp = token_logprobs(lm.model, torch.tensor([ids]), torch.ones(1, n, dtype=torch.long))[0][0].tolist()
        lp = [0.0] + lp
        roll = [(x - (shift_first if b == 0 and 2 <= t < 5 else 0.0)) * m for t, (x, m) in enumerate(zip(lp, mask))]
        out.append(TrainingRow(ids, mask, roll, [(1.0 - 2 * b) * m for m in mask], [0 if m else -1 for m in mask],
                               group_id="g"))
    return out


def _step(lm, rows, correction: str, cap: float = 2.0, bounds=(0.999, 1.001)):
    model = copy.deepcopy(lm.model)
    tr = Trainer(model, OptimSettings(lr=0.0))
    tr.optimizer.step = lambda: None  # keep the gradient for inspection
    tr.optimizer.zero_grad = lambda set_to_none=True: None
    m = tr.rl_step(rows, RLRequest(objective="ppo", params=objective_params(AlgoConfig()), agg="token-mean",
                                   correction=correction, correction_cap=cap, geometric_bounds=bounds, kl_coef=0.0,
                                   topk_weight=0.0, routing_replay=True, qdq_align=False))
    return model.model.embed_tokens.weight.grad.clone(), m


def test_masked_tokens_leave_the_loss_and_its_denominator(lm):
    # e^1 = 2.72 > cap 2: row 0's first three trained tokens are masked; every other weight is 1
    g_mis, m = _step(lm, _rows(lm, 1.0), "token-mis")
    assert m["correction_masked_frac"] == pytest.approx(3 / 17)  # 3 of 7 + 10 trained tokens
    assert m["correction_capped_frac"] == 0.0 and m["correction_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["trained_tokens"] == 14.0
    # the same update as training without those tokens at all (token-mean over 14, not 17)
    g_ref, _ = _step(lm, _rows(lm, 0.0, masked={(0, 2), (0, 3), (0, 4)}), "none")
    scale = g_ref.abs().max()
    assert (g_mis - g_ref).abs().max() < 1e-4 * scale
    # truncation keeps them, at weight 2, in a denominator of 17: a different update
    g_tis, m = _step(lm, _rows(lm, 1.0), "token")
    assert m["correction_capped_frac"] == pytest.approx(3 / 17) and m["correction_masked_frac"] == 0.0
    assert m["correction_weight_mean"] == pytest.approx((3 * 2.0 + 14) / 17, rel=1e-4)
    assert (g_tis - g_ref).abs().max() > 1e-2 * scale


def test_sequence_masks_drop_whole_rows(lm):
    # row 0: product e^3 = 20 > 2, and the bounded geometric mean of mu/pi_old is e^(-3/7) = 0.65 < 0.999: row 0 goes
    for mode in ("sequence-mis", "geometric"):
        g, m = _step(lm, _rows(lm, 1.0), mode)
        assert m["correction_masked_frac"] == pytest.approx(7 / 17), mode
        assert m["trained_tokens"] == 10.0
    g_ref, _ = _step(lm, _rows(lm, 0.0, masked={(0, t) for t in range(9)}), "none")
    assert (g - g_ref).abs().max() < 1e-4 * g_ref.abs().max()
    # a shift of 0.0003 nats per token: geometric mean e^(0.0009/7) is inside [0.999, 1.001]
    _, m = _step(lm, _rows(lm, 0.0003), "geometric")
    assert m["correction_masked_frac"] == 0.0
