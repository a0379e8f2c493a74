"""From finished Samples to TrainingRows: advantages, no-contrast filtering, ledger counts."""

from __future__ import annotations

import torch

from rlonce.algo.advantages import group_advantages
from rlonce.core.records import Sample, TrainingRow, sequence_to_rows
from rlonce.rollout.ledger import LedgerEntry


def has_contrast(rewards: list[float]) -> bool:
    """A group carries group-relative signal only with two or more valid, unequal rewards."""
    return len(rewards) >= 2 and max(rewards) > min(rewards)


def rows_from_samples(samples: list[Sample], step: int, *, norm_by_std: bool = False,
                      filter_no_contrast: bool = True) -> tuple[list[TrainingRow], dict[str, LedgerEntry]]:
    ledger: dict[str, LedgerEntry] = {}
    rows: list[TrainingRow] = []
    for sample in samples:
        entry = ledger.setdefault(sample.source, LedgerEntry(step, sample.source))
        seqs = sample.sequences
        valid = [not s.infra_failed for s in seqs]
        entry.dispatched += len(seqs)
        entry.infra_failed += valid.count(False)
        entry.finished += valid.count(True)
        rewards = [s.reward for s, ok in zip(seqs, valid) if ok]
        if filter_no_contrast and not has_contrast(rewards):
            entry.no_contrast_filtered += len(rewards)
            continue
        scores = torch.tensor([s.reward if ok else 0.0 for s, ok in zip(seqs, valid)])
        adv = group_advantages(scores, [sample.group_id] * len(seqs), norm_by_std=norm_by_std,
                               valid_N=torch.tensor(valid))
        for s, ok, a in zip(seqs, valid, adv.tolist()):
            if ok:
                rows += sequence_to_rows(s, a, group_id=sample.group_id)
                entry.retained += 1
    for e in ledger.values():
        e.check()
    return rows, ledger
