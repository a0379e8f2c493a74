"""The step ledger: where every dispatched sequence went. Its sums must balance.

    carried_in + dispatched = infra_failed + no_contrast_filtered + penalty_rejected
                              + unfinished_dropped + stale_dropped + retained + carried_over
    infra_failed            = Σ infra_by_category

``carried_in``/``carried_over`` are sequences still open (running, or finished and waiting in
the replay buffer) at the step's start/end; with a synchronous batch both are 0 and the
equation reads ``dispatched = infra_failed + filtered + rejected + unfinished + retained``.
``unfinished_dropped`` counts groups (in sequences) left with nothing to train on because every
sequence was cut by a budget without a pass under ``algo.mask_unfinished``; ``penalty_rejected``
those whose every context the penalty module dropped. ``finished`` counts sequences that ended
this step without an infrastructure failure.

Counted per task source. Rewrites that keep a sequence are counted beside the partition:
``hack_zeroed`` (a confirmed hack's reward set to 0), ``length_penalized`` (a length
deduction applied), ``zero_advantage`` (a retained sequence whose every context the penalty
module dropped), ``contexts_dropped`` and ``unfinished_masked`` (a sequence cut by a budget
without a pass, given no rows under ``algo.mask_unfinished``; at most ``finished``), and
``policy_input_errors`` (a finished sequence in which the policy's own input — a command, path,
argument or answer no tool or grader could take — was booked as its failed attempt, never as
infrastructure; at most ``finished``), and ``no_contrast_all_passed`` (of
``no_contrast_filtered``, the sequences of groups filtered because every one passed: too easy,
where the rest were filtered because every one failed).
``groups_short`` counts groups, not sequences: how many
the step's batch lacks of its target after a sync step spent its dispatch cap (seed 001: "The
mixer has to buy the batch it promised"). Also in groups, beside the partition: ``stale_reissued``
(stale groups whose task was queued to run again, their sequences counted in ``stale_dropped``)
and ``difficulty_skipped`` (tasks the difficulty filter passed over before dispatch). A ledger
that does not balance is a bug, raised at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class LedgerImbalance(AssertionError):
    pass


@dataclass
class LedgerEntry:
    step: int
    source: str
    dispatched: int = 0
    finished: int = 0
    infra_failed: int = 0
    no_contrast_filtered: int = 0
    no_contrast_all_passed: int = 0
    penalty_rejected: int = 0
    unfinished_dropped: int = 0
    retained: int = 0
    hack_zeroed: int = 0
    length_penalized: int = 0
    zero_advantage: int = 0
    contexts_dropped: int = 0
    unfinished_masked: int = 0
    policy_input_errors: int = 0
    carried_in: int = 0
    stale_dropped: int = 0
    carried_over: int = 0
    groups_short: int = 0
    stale_reissued: int = 0
    difficulty_skipped: int = 0
    infra_by_category: dict[str, int] = field(default_factory=dict)

    def check(self) -> None:
        out = (self.infra_failed + self.no_contrast_filtered + self.penalty_rejected + self.unfinished_dropped
               + self.stale_dropped + self.retained + self.carried_over)
        if self.carried_in + self.dispatched != out:
            raise LedgerImbalance(
                f"step {self.step} {self.source}: carried_in {self.carried_in} + dispatched {self.dispatched} != "
                f"infra_failed {self.infra_failed} + filtered {self.no_contrast_filtered} + rejected "
                f"{self.penalty_rejected} + unfinished {self.unfinished_dropped} + stale {self.stale_dropped} "
                f"+ retained {self.retained} + carried_over {self.carried_over}")
        if self.no_contrast_all_passed > self.no_contrast_filtered:
            raise LedgerImbalance(f"step {self.step} {self.source}: no_contrast_all_passed "
                                  f"{self.no_contrast_all_passed} > filtered {self.no_contrast_filtered}")
        for k in ("unfinished_masked", "policy_input_errors"):
            if getattr(self, k) > self.finished:
                raise LedgerImbalance(f"step {self.step} {self.source}: {k} {getattr(self, k)} > "
                                      f"finished {self.finished}")
        if self.infra_by_category and sum(self.infra_by_category.values()) != self.infra_failed:
            raise LedgerImbalance(f"step {self.step} {self.source}: infra categories {self.infra_by_category} do not "
                                  f"sum to infra_failed {self.infra_failed}")

    def to_dict(self) -> dict:
        return asdict(self)
