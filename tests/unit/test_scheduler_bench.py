"""The scheduler benchmark's mixed case: what it reads of a measured run and how it scores the
mixture, against hand-computed values (``benchmarks/scheduler/run.py``)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from rlonce.core.ledger import LedgerEntry
from rlonce.core.records import FailureCategory, Sequence, Status
from rlonce.telemetry.step import StepInputs, step_record

PATH = Path(__file__).parents[2] / "benchmarks" / "scheduler" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("scheduler_bench", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def _seq(seconds: float, tokens: float, infra: bool = False) -> Sequence:
    kw = {"status": Status.INFRA, "failure": FailureCategory.SANDBOX_ERROR} if infra else {}
    return Sequence("t", "arm", reward=0.0, metrics={"seconds": seconds, "context_tokens": tokens}, **kw)


def _row(step: int, entries: dict[str, LedgerEntry], seqs: dict[str, list[Sequence]]) -> dict:
    finished = [s for v in seqs.values() for s in v]
    labels = [n for n, v in seqs.items() for _ in v]
    x = StepInputs(step=step, finished=finished, trained=[], ledger=entries, rollout_seconds=1.0,
                   train_seconds=2.0 * step, retained_rows=0, version=step, violations=0, finished_sources=labels,
                   shares={"a": 0.5, "b": 0.5}, taken_groups={"a": 1, "b": 0})
    return step_record(x, {}, {})


def test_measured_sources_reads_what_a_mixed_run_writes(bench):
    a1, b1 = LedgerEntry(1, "a", dispatched=16, no_contrast_filtered=8), LedgerEntry(1, "b", dispatched=8,
                                                                                       no_contrast_filtered=8)
    a2, b2 = LedgerEntry(2, "a", dispatched=16, infra_failed=4, penalty_rejected=6), LedgerEntry(2, "b")
    rows = [_row(1, {"a": a1, "b": b1}, {"a": [_seq(2, 100), _seq(4, 300)], "b": [_seq(9, 50)]}),
            _row(2, {"a": a2, "b": b2}, {"a": [_seq(5, 400, infra=True)], "b": []})]
    m = bench.measured_sources(rows)
    a, b = m["a"], m["b"]
    assert a["steps"] == 2 and a["durations"] == [3.0, 5.0] and a["duration"] == 4.0
    assert a["duration_cv"] == pytest.approx(0.25)  # pstdev(3, 5) / 4
    assert a["acceptance"] == pytest.approx(1 - 14 / 28)  # filtered over dispatched less infra, in sequences
    assert a["infra"] == pytest.approx(4 / 32) and a["tokens"] == 300.0 and a["retained_groups"] == 2.0
    assert b["steps"] == 1 and b["acceptance"] == 0.0 and b["durations"] == [9.0]  # step 2 dispatched none of b


def test_mixture_scores_shares_after_warmup(bench):
    warm = [{"target": {"a": 2, "b": 1}, "retained": {"a": 0, "b": 0}, "idle_s": 0.0, "end_s": float(i + 1)}
            for i in range(bench.WARMUP)]
    after = [{"target": {"a": 2, "b": 1}, "retained": {"a": 2, "b": r}, "idle_s": 0.5, "end_s": bench.WARMUP + i + 1.0}
             for i, r in enumerate([1, 0, 1, 0])]
    run = {"mode": "sync", "batch": 3, "plans": {"a": (2 / 3, 1), "b": (1 / 3, 1)}, "per_step": warm + after}
    info = {"a": {"floored": False}, "b": {"floored": True}}
    r = bench.mixture(run, info, scale=0.5)
    assert r["measured_steps"] == 4 and r["sources"]["b"]["groups_short"] == 2
    assert r["sources"]["a"]["retained_share"] == pytest.approx(8 / 10)
    assert r["max_mixture_error"] == pytest.approx(8 / 10 - 2 / 3)
    assert r["able_sources"] == ["a"] and r["max_mixture_error_able"] == pytest.approx(0.0)
    assert r["trainer_idle_fraction"] == pytest.approx(2.0 / 4.0)  # wall: steps 5–8 end 4 s after step 4
    assert r["retained_groups_per_real_min"] == pytest.approx(60 * 10 * 0.5 / 4)
