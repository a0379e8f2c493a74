"""Group-relative advantages (GRPO).

``A_i = s_i - mean(group)``; with ``norm_by_std`` divided by ``std + eps`` (unbiased std, as
``torch.std``). Seed 001 ("The equation only works if the history is true"): the public Code
recipe disables std normalisation, so it is off by default here. Rows marked invalid
(infrastructure failures) are left out of their group's statistics and get advantage 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(scores_N: torch.Tensor, group_ids_N: Sequence, *, norm_by_std: bool = False,
                     eps: float = 1e-6, valid_N: torch.Tensor | None = None) -> torch.Tensor:
    scores_N = torch.as_tensor(scores_N, dtype=torch.float32)
    n = scores_N.shape[0]
    if len(group_ids_N) != n:
        raise ValueError(f"{n} scores but {len(group_ids_N)} group ids")
    valid_N = torch.ones(n, dtype=torch.bool) if valid_N is None else torch.as_tensor(valid_N, dtype=torch.bool)
    adv_N = torch.zeros(n)
    groups: dict = {}
    for i, g in enumerate(group_ids_N):
        groups.setdefault(g, []).append(i)
    for idx in groups.values():
        idx_t = torch.tensor(idx)
        ok = idx_t[valid_N[idx_t]]
        if len(ok) == 0:
            continue
        s = scores_N[ok]
        mean = s.mean() if len(ok) > 1 else torch.tensor(0.0)
        std = s.std() if len(ok) > 1 else torch.tensor(1.0)
        a = s - mean
        if norm_by_std:
            a = a / (std + eps)
        adv_N[ok] = a
    return adv_N
