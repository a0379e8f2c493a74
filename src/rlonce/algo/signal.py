"""The order of operations that turns graded Samples into TrainingRows — written once, here.

Order is part of the objective (DESIGN.md, "Learning signal"). Per Sample (one GRPO group):

 0. penalty rules detect on every model segment (flags written onto the segments)
 1. infrastructure failures leave the group: never scored, never in its statistics — among
    them every unusable grade (no verdict, a grader error, a non-finite reward: ``Grade``
    refuses one and ``grade_or_infra`` makes the sequence ``grader_unavailable``), so no score
    reaches step 6 invalid and ``group_advantages``' ``valid_N`` fill is not used here
 2. confirmed hacks → reward 0                          (before any group statistic)
 3. GRS: reward = R_test · S_sol · S_beh                (rubric scores; fallback R_test)
 4. length shaping: deduction on passing rows            (gate on the group's pass rate)
 5. dynamic filtering on the shaped scores               (no contrast → whole group dropped)
 6. group-relative advantages (optional std normalisation)
 7. GAR redistribution among passing rows                (quality factors; fallback: unchanged)
 8. broadcast to tokens: each exported context of a sequence becomes a row (all, or the
    longest: ``export_contexts``), the sequence's advantage on its model tokens only; with
    ``mask_unfinished`` a sequence cut by a budget without a pass gets no rows (its score
    stayed in steps 5–7: the public path masks its tokens, not its reward)
 8b. a distilled source (``SignalSettings.distill``): the group advantage scaled by its reward
    weight at 6, no group filtered at 5, and each trained token's advantage plus kl_weight ·
    (teacher log-prob − rollout log-prob) (``distill_advantages``)
 9. penalty row strategies on flagged tokens (mask, adv_set, adv_reduction), in the order configured
10. escalation: rows without surviving model tokens are dropped; a sequence with none left has
    zero advantage; a sample with none left is rejected

Then once over the step's batch (all rows of all groups trained on):

11. the batch strategy (adv_signed, ``rebalance_batch``): the signed rebalance over every live
    token of the batch, its masses weighted by the aggregation's token weights — seed 000's
    "Batch-level advantage rebalancing", seed 001's mass "with appropriate token weighting
    where used". The orchestrator judges groups one at a time through step 10 and runs step
    11 when it closes a step (``rlonce.rollout.groups.Judge.batch``).

Every drop and rewrite is counted in the step's ledger, whose sums are checked.
Trainer-side corrections (rollout correction, the objective, aggregation) come after this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlonce.algo import penalties
from rlonce.algo.advantages import group_advantages
from rlonce.algo.losses import AGGREGATIONS, aggregation_weights
from rlonce.algo.shaping import gar_redistribute, grs_reward, keep_groups, length_penalty, zero_confirmed_hacks
from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import Sample, Sequence, Status, TrainingRow, sequence_to_rows


@dataclass(kw_only=True)
class LengthShaping:
    metrics: tuple[str, ...] = ("turns", "input_tokens", "output_tokens")
    """Any of 'turns', 'input_tokens' (observations and prompts), 'output_tokens' (model tokens);
    the default is the public reference profile's three (seed 001), combined by ``combine``."""
    max_penalty: float = 0.2
    deadzone: float = 0.0
    saturation: float = 1.0
    exponent: float = 1.5
    anchor_quantile: float = 0.3
    pass_rate_gate: float = 0.5
    combine: str = "max"


@dataclass(kw_only=True)
class SignalSettings:
    norm_by_std: bool = False
    filter_no_contrast: bool = True
    zero_hacks: bool = True
    grs: bool = False
    gar: bool = False
    gar_lambda_max: float = 2.0
    length: LengthShaping | None = None
    penalties: list[penalties.PenaltySpec] = field(default_factory=list)
    aggregation: str = "token-mean"
    """The trainer's aggregation (``rlonce.algo.losses.AGGREGATIONS``): its token weights weigh the
    signed rebalance's masses."""
    export_contexts: str = "all"
    """Which contexts of a sequence become rows (``CONTEXT_EXPORTS``)."""
    mask_unfinished: bool = False
    """Sequences cut by a budget without a pass get no rows (their score stays in the group's statistics)."""
    distill: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Distilled sources by label: (kl_weight, reward_weight). Their groups are never filtered for
    lacking contrast, their group advantages are scaled by reward_weight, and each trained token
    gains ``kl_weight · (teacher log-prob − rollout log-prob)`` (``distill_advantages``)."""
    distill_clip: float | None = None
    """Bound on each token's |teacher log-prob − rollout log-prob| in the distillation advantage
    (None: unbounded)."""
    lr_scale: dict[str, float] = field(default_factory=dict)
    """Sources by label whose rows take another learning rate: its ratio to ``rl.lr``
    (``TrainingRow.lr_scale``); the others 1."""

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; known: {sorted(AGGREGATIONS)}")
        if self.export_contexts not in CONTEXT_EXPORTS:
            raise ValueError(f"unknown context export {self.export_contexts!r}; known: {sorted(CONTEXT_EXPORTS)}")


LENGTH_METRICS: dict[str, Callable[[Sequence], float]] = {
    "turns": lambda seq: float(seq.turns),
    "input_tokens": lambda seq: float(sum(len(c) - c.model_tokens() for c in seq.contexts)),
    "output_tokens": lambda seq: float(sum(c.model_tokens() for c in seq.contexts)),
}
"""Length measures of a sequence by name (``algo.length.metrics``)."""


def _longest_context(seq: Sequence) -> list[int]:
    lengths = [len(c) for c in seq.contexts]
    return [max(range(len(lengths)), key=lambda c: (lengths[c], c))] if lengths else []


CONTEXT_EXPORTS: dict[str, Callable[[Sequence], list[int]]] = {
    "all": lambda seq: list(range(len(seq.contexts))),
    "longest": _longest_context,
}
"""Which contexts of a sequence are exported as rows, by name (``algo.export_contexts``): every
context, or the one with the most tokens (the latest of equals) — seed 001, "The public Code
recipe selects the longest trajectory for export"."""


def length_metric(seq: Sequence, name: str) -> float:
    try:
        return LENGTH_METRICS[name](seq)
    except KeyError:
        raise ValueError(f"unknown length metric {name!r}; known: {sorted(LENGTH_METRICS)}") from None


def _or(grade: float | None, default: float) -> float:
    """A model grader's output (``Sequence.grades``), or ``default`` where it gave none."""
    return default if grade is None else float(grade)


def _scores(seqs: list[Sequence], settings: SignalSettings, entry: LedgerEntry, stats: dict):
    """Steps 2–4 over the valid sequences of one group: returns shaped scores and pass flags."""
    for s in seqs:
        if s.reward is None or not math.isfinite(s.reward):
            raise ValueError(f"sequence of {s.task_id} ({s.status.value}) has reward {s.reward}: a grade that is "
                             "missing or not finite must make the sequence an infrastructure failure")
    raw = torch.tensor([float(s.reward) for s in seqs])
    passed = torch.tensor([s.passed for s in seqs], dtype=torch.bool)
    if settings.zero_hacks:
        hacks = torch.tensor([s.hack_confirmed for s in seqs], dtype=torch.bool)
        raw, n = zero_confirmed_hacks(raw, hacks)
        passed &= ~hacks
        entry.hack_zeroed += n
    scores = raw
    if settings.grs:
        sol = torch.tensor([_or(s.grades.rubric_solution, 1.0) for s in seqs])
        beh = torch.tensor([_or(s.grades.rubric_behavior, 1.0) for s in seqs])
        stats["grs_fallback"] += sum(s.grades.rubric_solution is None or s.grades.rubric_behavior is None
                                     for s, p in zip(seqs, passed) if p)
        scores = grs_reward(scores, sol, beh, passed)
    if settings.length is not None:
        ls = settings.length
        lengths = {m: torch.tensor([length_metric(s, m) for s in seqs]) for m in ls.metrics}
        ded = length_penalty(lengths, passed, max_penalty=ls.max_penalty, deadzone=ls.deadzone,
                             saturation=ls.saturation, exponent=ls.exponent, anchor_quantile=ls.anchor_quantile,
                             pass_rate_gate=ls.pass_rate_gate, combine=ls.combine)
        entry.length_penalized += int((ded > 0).sum())
        stats["length_deduction_sum"] += float(ded.sum())
        scores = scores - ded
    return scores, passed


def _unfinished(seq: Sequence, passed: bool) -> bool:
    """Cut by a budget (``Status.LIMITS``) without a pass: the seed's ``finished=False``."""
    return seq.status is Status.LIMITS and not passed


def _export(sample: Sample, seqs: list[Sequence], adv: torch.Tensor, passed: torch.Tensor, settings: SignalSettings,
            stats: dict) -> tuple[list[TrainingRow], list[dict[str, list[bool]]], list[int], int]:
    """Step 8 on one group: the rows of the exported contexts, their flagged tokens per rule, the
    index of each row's sequence, and how many sequences were masked as unfinished."""
    rows: list[TrainingRow] = []
    flags: list[dict[str, list[bool]]] = []
    owner: list[int] = []
    masked = 0
    for i, (seq, a) in enumerate(zip(seqs, adv.tolist())):
        if settings.mask_unfinished and _unfinished(seq, bool(passed[i])):
            masked += 1
            continue
        seq_rows = sequence_to_rows(seq, a, group_id=sample.group_id)
        per_rule = {spec.rule: penalties.flagged_tokens(seq, spec.rule) for spec in settings.penalties}
        exported = CONTEXT_EXPORTS[settings.export_contexts](seq)
        stats["contexts_unexported"] += len(seq_rows) - len(exported)
        for c in exported:
            seq_rows[c].flags = {s.rule: per_rule[s.rule][c] for s in batch_strategies(settings)}
            rows.append(seq_rows[c])
            flags.append({rule: f[c] for rule, f in per_rule.items()})
            owner.append(i)
    return rows, flags, owner, masked


def distill_advantages(rows: list[TrainingRow], kl_weight: float, clip: float | None = None) -> tuple[float, int]:
    """Step 8b on a distilled group's rows, in place: each trained token's advantage gains
    ``kl_weight · (log π_teacher(t) − log π_rollout(t))`` — minus the per-token reverse KL
    log π_student/π_teacher of the sampled token, the on-policy distillation reward (seed 001,
    MOPD2; tinker-cookbook's on-policy distillation takes the same per-token form). Returns
    (Σ over trained tokens of log π_rollout − log π_teacher, their count): the sampled reverse KL,
    unclipped. ``clip`` bounds each token's log-ratio in the advantage to [−clip, clip]: a teacher
    far more certain than the student (log π_teacher = −24 on the student's favourite wrong digit)
    otherwise gives one token an advantage dozens of times its neighbours'."""
    kl, n = 0.0, 0
    for row in rows:
        if row.teacher_logprobs is None:
            if any(row.loss_mask):
                raise ValueError(f"a row of group {row.group_id} has trained tokens but no teacher log-probs: "
                                 "its teacher did not score it")
            continue
        adv = list(row.advantages)
        for t, (m, lp, tlp) in enumerate(zip(row.loss_mask, row.rollout_logprobs, row.teacher_logprobs)):
            if m:
                d = tlp - lp
                adv[t] += kl_weight * (d if clip is None else max(-clip, min(clip, d)))
                kl += lp - tlp
                n += 1
        row.advantages = adv
    return kl, n


def _apply_row_strategies(rows: list[TrainingRow], flags: list[dict[str, list[bool]]],
                          settings: SignalSettings) -> None:
    """Step 9 on one group's rows, in place."""
    for row, row_flags in zip(rows, flags):
        adv_T = torch.tensor(row.advantages, dtype=torch.float64)
        mask_T = torch.tensor(row.loss_mask, dtype=torch.bool)
        for spec in settings.penalties:
            fn = penalties.ROW_STRATEGIES.get(spec.strategy)
            if fn is not None:
                adv_T, mask_T = fn(adv_T, mask_T, torch.tensor(row_flags[spec.rule]) & mask_T,
                                   **spec.strategy_params)
        row.loss_mask = [int(m) for m in mask_T.tolist()]
        row.advantages = [a if m else 0.0 for a, m in zip(adv_T.tolist(), row.loss_mask)]


def batch_strategies(settings: SignalSettings) -> list[penalties.PenaltySpec]:
    """The penalties whose strategy runs over the step's batch (``penalties.BATCH_STRATEGIES``)."""
    return [s for s in settings.penalties if s.strategy in penalties.BATCH_STRATEGIES]


def rebalance_batch(rows: list[TrainingRow], settings: SignalSettings) -> dict[str, float]:
    """Step 11 over one step's batch, in place: each batch strategy (``adv_signed``) over the live
    tokens of all ``rows``, its masses weighted per token by ``settings.aggregation``'s weights
    over the whole batch times the row weight — the weights the trainer gives those tokens.
    Returns ``rebalance_clamped`` (strategies whose α cap or β floor was hit) and
    ``rebalance_groups`` (groups with a flagged live token)."""
    stats = {"rebalance_clamped": 0, "rebalance_groups": 0}
    if not rows:
        return stats
    T = max(len(r) for r in rows)

    def padded_BT(field: Callable[[TrainingRow], list], dtype) -> torch.Tensor:
        return torch.tensor([field(r) + [0] * (T - len(r)) for r in rows], dtype=dtype)

    mask_BT = padded_BT(lambda r: r.loss_mask, torch.bool)
    w_BT = aggregation_weights(mask_BT, settings.aggregation, group_ids_B=[r.group_id for r in rows]).double()
    w_BT = w_BT * torch.tensor([r.weight for r in rows], dtype=torch.float64)[:, None]
    for spec in batch_strategies(settings):
        adv_BT = padded_BT(lambda r: r.advantages, torch.float64)
        hit_BT = padded_BT(lambda r, rule=spec.rule: r.flags.get(rule, [False] * len(r)), torch.bool) & mask_BT
        new, m = penalties.BATCH_STRATEGIES[spec.strategy](adv_BT[mask_BT], hit_BT[mask_BT], weights=w_BT[mask_BT],
                                                           **spec.strategy_params)
        adv_BT[mask_BT] = new
        stats["rebalance_clamped"] += int(m["alpha_clamped"] or m["beta_clamped"])
        stats["rebalance_groups"] += len({r.group_id for r, h in zip(rows, hit_BT.any(-1).tolist()) if h})
        for r, adv_T in zip(rows, adv_BT.tolist()):
            r.advantages = adv_T[:len(r)]
    return stats


def learning_signal(samples: list[Sample], step: int, settings: SignalSettings, *, decode=None, batch: bool = True
                    ) -> tuple[list[TrainingRow], dict[str, LedgerEntry], dict[str, float]]:
    """Rows to train on, the ledger per source, and step metrics (see the module docstring).
    ``samples`` are the step's batch; ``batch=False`` stops before step 11, for a caller that
    judges groups one at a time and runs ``rebalance_batch`` once over the step's rows."""
    stats: dict[str, float] = {k: 0 for k in ("grs_fallback", "length_deduction_sum", "gar_groups",
                                              "rebalance_clamped", "rebalance_groups", "contexts_unexported",
                                              "unfinished_masked")}
    stats.update(penalties.detect(samples, settings.penalties, decode))
    ledger: dict[str, LedgerEntry] = {}
    out: list[TrainingRow] = []
    for sample in samples:
        entry = ledger.setdefault(sample.source, LedgerEntry(step, sample.source))
        seqs = [s for s in sample.sequences if not s.infra_failed]
        entry.dispatched += len(sample.sequences)
        entry.infra_failed += len(sample.sequences) - len(seqs)
        for s in sample.sequences:
            if s.infra_failed:
                entry.infra_by_category[s.failure.value] = entry.infra_by_category.get(s.failure.value, 0) + 1
        entry.finished += len(seqs)
        entry.policy_input_errors += sum(s.metrics.get("policy_input_errors", 0.0) > 0 for s in seqs)
        if not seqs:
            continue
        gid = [sample.group_id] * len(seqs)
        scores, passed = _scores(seqs, settings, entry, stats)
        distill = settings.distill.get(sample.source)
        if (settings.filter_no_contrast and distill is None  # a distilled group trains on its teacher's signal
                and not keep_groups(scores, gid, torch.zeros(len(seqs), dtype=torch.bool)).any()):
            entry.no_contrast_filtered += len(seqs)
            entry.no_contrast_all_passed += len(seqs) if bool(passed.all()) else 0
            continue
        adv = group_advantages(scores, gid, norm_by_std=settings.norm_by_std)
        grouped = adv.tolist()
        if settings.gar:
            quality = torch.tensor([_or(s.grades.gar_quality, float("nan")) for s in seqs])
            new = gar_redistribute(adv, passed, quality, lambda_max=settings.gar_lambda_max)
            stats["gar_groups"] += int(not torch.equal(new, adv))
            adv = new
        if distill is not None:
            adv = adv * distill[1]
        rows, flags, owner, masked = _export(sample, seqs, adv, passed, settings, stats)
        entry.unfinished_masked += masked
        stats["unfinished_masked"] += masked
        if distill is not None:
            kl, n = distill_advantages(rows, distill[0], settings.distill_clip)
            for key, x in ((f"distill_kl_sum/{sample.source}", kl), (f"distill_tokens/{sample.source}", n)):
                stats[key] = stats.get(key, 0) + x
        _apply_row_strategies(rows, flags, settings)
        if (scale := settings.lr_scale.get(sample.source)) is not None:
            for r in rows:
                r.lr_scale = scale
        alive = [sum(r.loss_mask) > 0 for r in rows]
        entry.contexts_dropped += alive.count(False)
        survivors = {owner[k] for k, ok in enumerate(alive) if ok}
        if not survivors:  # every sequence masked as unfinished, or the penalties dropped what was left
            if masked == len(seqs):
                entry.unfinished_dropped += len(seqs)
            else:
                entry.penalty_rejected += len(seqs)
            continue
        entry.zero_advantage += len(seqs) - len(survivors) - masked
        entry.retained += len(seqs)
        out += [r for r, ok in zip(rows, alive) if ok]
        sample.signal = {"scores": scores.tolist(), "passed": passed.tolist(), "group_advantages": grouped,
                         "advantages": adv.tolist(), "rows": [owner[k] for k, ok in enumerate(alive) if ok],
                         **({"distill": {"kl_weight": distill[0], "reward_weight": distill[1],
                                         "clip": settings.distill_clip}} if distill else {})}
    for e in ledger.values():
        e.check()
    if batch:
        stats.update(rebalance_batch(out, settings))
    return out, ledger, stats
