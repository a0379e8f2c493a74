"""Rejection-sampling fine-tuning (RFT): between SFT and RL, the model attempts training tasks and
its own passing attempts become demonstrations (STaR, Zelikman et al. 2022; RFT, Yuan et al. 2023).

GRPO learns from a group only when it holds both a success and a failure; a source whose groups
rarely hold a success trains on almost nothing. RFT keeps every success the model finds in
``rft.samples`` attempts per task, whatever the rest of the group did, and fine-tunes on the
tokens the model itself sampled (the same token-mean cross-entropy as SFT, ``train_sft``).
Every attempt is counted: passed, kept, left out as a duplicate or over ``rft.keep``, failed,
failed in the infrastructure (``RUN/rft.json`` and ``summary.json``'s ``rft``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rlonce.config import SFTConfig
from rlonce.core.records import Sequence, Status
from rlonce.rollout.runner import collect

log = logging.getLogger(__name__)

RFT_SEED = 271828
"""RFT's attempts draw each turn from a seed of (RFT_SEED + runtime.seed, task, attempt): apart
from the evaluation's seeds (``rlonce.recipes.evaluate.EVAL_SEED``) and reproducible."""


def keepable(seq: Sequence) -> bool:
    """An attempt RFT may train on: it submitted, the grader passed it, and no hack check suspects it
    (a suspected shortcut that passed is the last thing to imitate)."""
    return (seq.passed and seq.status is Status.SUBMITTED and not seq.hack_confirmed
            and not seq.metrics.get("hack_suspected"))


def select(groups: list[list[Sequence]], keep: int) -> tuple[list[Sequence], dict]:
    """From each task's attempts, the first ``keep`` keepable ones with distinct sampled tokens, and
    the count of every attempt by what became of it."""
    kept, counts = [], {"attempts": 0, "infra_failed": 0, "passed": 0, "suspected": 0, "duplicates": 0,
                        "over_keep": 0, "tasks": len(groups), "tasks_passed": 0, "kept": 0}
    for seqs in groups:
        seen, mine = set(), 0
        for s in seqs:
            counts["attempts"] += 1
            if s.infra_failed:
                counts["infra_failed"] += 1
                continue
            counts["passed"] += int(s.passed)
            if not s.passed:
                continue
            if not keepable(s):
                counts["suspected"] += 1
                continue
            tokens = tuple(t for c in s.contexts for seg in c.segments if seg.trainable for t in seg.token_ids)
            if tokens in seen:
                counts["duplicates"] += 1
            elif mine >= keep:
                counts["over_keep"] += 1
            else:
                seen.add(tokens)
                kept.append(s)
                mine += 1
        counts["tasks_passed"] += int(mine > 0)
    counts["kept"] = len(kept)
    return kept, counts


@dataclass(frozen=True)
class RFTPlan:
    """What one RFT pass does, resolved from the run's config."""

    samples: int
    keep: int
    epochs: int
    sft: SFTConfig
    """The fine-tuning: ``sft``'s batch size and warm-up at RFT's peak learning rate."""
    seed: int


def plan_rft(cfg) -> RFTPlan:
    r = cfg.rft
    return RFTPlan(samples=r.samples, keep=r.keep, epochs=r.epochs, seed=RFT_SEED + cfg.runtime.seed,
                   sft=cfg.sft.model_copy(update={"lr": r.lr or cfg.sft.lr, "epochs": r.epochs}))


async def attempt(sources, engine, plan: RFTPlan, *, concurrency: int, progress: bool) -> dict[str, tuple]:
    """Per source with ``rft_tasks``, its attempts at its first training tasks: (kept, counts)."""
    out = {}
    for label, src in sources.items():
        n = src.plan.rft_tasks
        if n <= 0:
            continue
        tasks = [src.domain.task("train", i) for i in range(n)]
        samples = await collect(tasks, plan.samples, src.domain.env_factory, engine, src.spec,
                                concurrency=concurrency, desc=f"rft {label}", progress=progress, seed=plan.seed,
                                fault="rft.sequence")
        out[label] = select([x.sequences for x in samples], plan.keep)
    return out


def describe(label: str, c: dict) -> str:
    """One line of what RFT found in a source."""
    return (f"RFT {label}: {c['passed']} of {c['attempts'] - c['infra_failed']} attempts passed "
            f"({c['tasks_passed']} of {c['tasks']} tasks); kept {c['kept']}"
            + "".join(f", {c[k]} {why}" for k, why in LEFT_OUT.items() if c[k]))


LEFT_OUT = {"duplicates": "duplicates left out", "over_keep": "over rft.keep left out",
            "suspected": "suspected of a hack left out", "infra_failed": "failed in the infrastructure"}
"""The counts of ``select`` that name attempts not trained on, and how ``describe`` says them."""
