"""The step ledger: where every dispatched sequence went. Its sums must balance.

    dispatched = finished + infra_failed
    finished   = no_contrast_filtered + retained

Counted per task source. A ledger that does not balance is a bug, raised at once.
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
    retained: int = 0

    def check(self) -> None:
        if self.dispatched != self.finished + self.infra_failed:
            raise LedgerImbalance(f"step {self.step} {self.source}: dispatched {self.dispatched} != finished "
                                  f"{self.finished} + infra_failed {self.infra_failed}")
        if self.finished != self.no_contrast_filtered + self.retained:
            raise LedgerImbalance(f"step {self.step} {self.source}: finished {self.finished} != filtered "
                                  f"{self.no_contrast_filtered} + retained {self.retained}")

    def to_dict(self) -> dict:
        return asdict(self)
