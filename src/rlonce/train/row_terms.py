"""What the trainer computes for every row before its mini-batches: the rollout correction's
weights and the tokens it masks (``rlonce.algo.rollout_correction``), and the frozen reference
policy that the optional KL term is measured against.

Masked tokens leave the row's loss mask, so they drop out of every aggregation denominator as
well as the gradient: a masked token is rejected, not counted as a zero (verl's rollout
correction makes the same choice: rejected tokens leave the loss normaliser).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from rlonce.algo.correction import rollout_correction
from rlonce.core.records import TrainingRow


def pad_like(mask_BT: torch.Tensor, rows_T: list[torch.Tensor]) -> torch.Tensor:
    """Per-row tensors (each at most T long) right-padded with zeros to ``mask_BT``'s shape."""
    out = torch.zeros_like(mask_BT)
    for b, r in enumerate(rows_T):
        out[b, : len(r)] = r
    return out


def correct_rows(rows: list[TrainingRow], old_lp: list[torch.Tensor], *, mode: str, cap: float,
                 bounds: tuple[float, float]) -> tuple[list[TrainingRow], list[torch.Tensor], dict[str, float]]:
    """``rows`` with the tokens the correction masks taken out of their loss masks, each row's
    correction weights (length ``len(row) - 1``, aligned like ``old_lp``), and token counts for
    ``correction_metrics``: valid, kept, capped and masked tokens and the sum of kept weights.
    ``old_lp``: π_old of each row's next tokens (``Trainer._recompute``)."""
    if not rows:
        return rows, [], {"correction_valid": 0.0, "correction_kept": 0.0, "correction_capped": 0.0,
                          "correction_masked": 0.0, "correction_weight_sum": 0.0}
    T = max(len(r) for r in rows) - 1
    mask_BT, roll_BT = torch.zeros((len(rows), T)), torch.zeros((len(rows), T))
    for b, r in enumerate(rows):
        mask_BT[b, : len(r) - 1] = torch.tensor(r.loss_mask[1:], dtype=torch.float32)
        roll_BT[b, : len(r) - 1] = torch.tensor(r.rollout_logprobs[1:])
    w_BT, keep_BT, m = rollout_correction(pad_like(mask_BT, old_lp), roll_BT, mask_BT, mode=mode, cap=cap,
                                          bounds=bounds)
    out = []
    for b, r in enumerate(rows):
        keep = [0] + [int(k) for k in keep_BT[b, : len(r) - 1].tolist()]
        out.append(r if keep == [int(x) for x in r.loss_mask] else dataclasses.replace(r, loss_mask=keep))
    valid, kept = float(mask_BT.sum()), float(keep_BT.sum())
    counts = {"correction_valid": valid, "correction_kept": kept,
              "correction_capped": m["correction_capped_frac"] * valid,
              "correction_masked": m["correction_masked_frac"] * valid,
              "correction_weight_sum": m["correction_weight_mean"] * kept}
    return out, [w_BT[b, : len(r) - 1] for b, r in enumerate(rows)], counts


def correction_metrics(counts: dict[str, float]) -> dict[str, float]:
    """The correction's metrics from ``correct_rows``' counts (summed over ranks): shares of the
    valid tokens whose weight the cap truncated and that were masked, the mean kept weight."""
    valid, kept = max(counts["correction_valid"], 1.0), max(counts["correction_kept"], 1.0)
    return {"correction_capped_frac": counts["correction_capped"] / valid,
            "correction_masked_frac": counts["correction_masked"] / valid,
            "correction_weight_mean": counts["correction_weight_sum"] / kept}


def same_version(row: TrainingRow, train_lp_T: torch.Tensor, version: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rollout, trainer) log-probs of ``row``'s trained tokens sampled by ``version`` (the
    train/inference mismatch is measured on them)."""
    keep = torch.tensor([bool(m) and v == version for m, v in zip(row.loss_mask[1:], row.policy_versions[1:])],
                        dtype=torch.bool)
    return torch.tensor(row.rollout_logprobs[1:])[keep], train_lp_T.float()[keep]


def frozen_copy(model) -> torch.nn.Module:
    """A copy of ``model`` that never trains: the KL term's reference policy. No engine here can
    return log-probs under other weights than the ones it samples with, so the reference costs
    one copy of the weights in the trainer (only when KL is on)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
