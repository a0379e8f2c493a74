"""The step ledger: where every dispatched sequence went. Its sums must balance.

    dispatched = finished + infra_failed
    finished   = no_contrast_filtered + penalty_rejected + retained

Counted per task source. Rewrites that keep a sequence are counted beside the partition:
``hack_zeroed`` (a confirmed hack's reward set to 0), ``length_penalized`` (a length
deduction applied), ``zero_advantage`` (a retained sequence whose every context the penalty
module dropped) and ``contexts_dropped``. A ledger that does not balance is a bug, raised at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
    penalty_rejected: int = 0
    retained: int = 0
    hack_zeroed: int = 0
    length_penalized: int = 0
    zero_advantage: int = 0
    contexts_dropped: int = 0

    def check(self) -> None:
        if self.dispatched != self.finished + self.infra_failed:
            raise LedgerImbalance(f"step {self.step} {self.source}: dispatched {self.dispatched} != finished "
                                  f"{self.finished} + infra_failed {self.infra_failed}")
        if self.finished != self.no_contrast_filtered + self.penalty_rejected + self.retained:
            raise LedgerImbalance(f"step {self.step} {self.source}: finished {self.finished} != filtered "
                                  f"{self.no_contrast_filtered} + rejected {self.penalty_rejected} + retained "
                                  f"{self.retained}")

    def to_dict(self) -> dict:
        return asdict(self)
