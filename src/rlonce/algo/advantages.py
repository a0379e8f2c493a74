"""Group-relative advantages (GRPO) and their broadcast over a session's outputs.

``A_i = s_i - mean(group)``; with ``norm_by_std`` divided by ``std + eps`` (unbiased std, as
``torch.std``). Seed 001 ("The equation only works if the history is true"): the public Code
recipe disables std normalisation, so it is off by default here.

Rows marked invalid (``valid_N``: an unusable grade) follow the public GRPO kernel (seed 001,
"Invalid scores are replaced with the mean of valid group scores, or zero if none exist, and
invalid advantages are then explicitly zeroed."): an invalid score takes the valid rows' mean,
so it leaves the mean unchanged but counts in the std's ``n`` (the std shrinks by
``sqrt((k - 1)/(n - 1))`` with ``k`` valid rows of ``n``), and its advantage is then set to 0.
A group with one valid row among several therefore gives it advantage 0. A singleton group
(one row) uses mean 0 and std 1, so its lone score is its advantage (nothing to compare
against; dynamic filtering normally drops such groups). ``learning_signal`` never marks a row
invalid: an unusable grade (none, a grader error, a non-finite reward) makes its sequence an
infrastructure failure (``rlonce.envs.base.grade_or_infra``), and infrastructure failures leave
their group before this function (the seed's infrastructure-UID exclusion, which precedes
GRPO) — so, unlike a filled row, they do not count in the std's ``n``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _groups(group_ids_N: Sequence) -> list[list[int]]:
    groups: dict = {}
    for i, g in enumerate(group_ids_N):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def group_advantages(scores_N: torch.Tensor, group_ids_N: Sequence, *, norm_by_std: bool = False,
                     eps: float = 1e-6, valid_N: torch.Tensor | None = None) -> torch.Tensor:
    scores_N = torch.as_tensor(scores_N, dtype=torch.float32)
    n = scores_N.shape[0]
    if len(group_ids_N) != n:
        raise ValueError(f"{n} scores but {len(group_ids_N)} group ids")
    valid_N = torch.ones(n, dtype=torch.bool) if valid_N is None else torch.as_tensor(valid_N, dtype=torch.bool)
    if not torch.isfinite(scores_N[valid_N]).all():
        raise ValueError("a valid score is NaN or infinite; mark unusable rewards invalid with valid_N")
    adv_N = torch.zeros(n)
    for idx in _groups(group_ids_N):
        idx_t = torch.tensor(idx)
        ok_G = valid_N[idx_t]
        if not ok_G.any():
            continue
        # in float64: equal scores' float32 mean leaves a residue that std normalisation (std ~ the
        # residue, + eps) blows up to a spurious ~0.1 advantage of one sign
        s_G = scores_N[idx_t].double()
        s_G = torch.where(ok_G, s_G, s_G[ok_G].mean())
        mean = s_G.mean() if len(idx) > 1 else torch.tensor(0.0, dtype=torch.float64)
        std = s_G.std() if len(idx) > 1 else torch.tensor(1.0, dtype=torch.float64)
        a_G = s_G - mean
        if norm_by_std:
            a_G = a_G / (std + eps)
        adv_N[idx_t] = torch.where(ok_G, a_G, torch.zeros_like(a_G)).float()
    return adv_N


def broadcast_session_advantages(final_scores_S: torch.Tensor, group_ids_S: Sequence, session_of_R: Sequence[int],
                                 mask_RT: torch.Tensor, *, norm_by_std: bool = False, eps: float = 1e-6,
                                 valid_S: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages for sessions that produced several outputs (contexts: sub-agents, compaction).

    The group advantage is computed once per session from its final output's score, then every
    output row ``r`` of session ``session_of_R[r]`` gets that advantage on its masked tokens:
    ``A_RT[r, t] = A_S[session_of_R[r]] · mask_RT[r, t]``. Sessions, not outputs, are the group
    members, so a session with many contexts does not count many times in the baseline.
    """
    adv_S = group_advantages(final_scores_S, group_ids_S, norm_by_std=norm_by_std, eps=eps, valid_N=valid_S)
    idx_R = torch.as_tensor(list(session_of_R), dtype=torch.long)
    if len(idx_R) != mask_RT.shape[0]:
        raise ValueError(f"{mask_RT.shape[0]} output rows but {len(idx_R)} session indices")
    return adv_S[idx_R][:, None] * mask_RT.float()
