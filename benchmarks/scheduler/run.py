"""The orchestrator under a 25-source workload: sync vs async vs the work-conserving bound.

    python benchmarks/scheduler/run.py --out DIR [--steps 40] [--train-s 0.4] [--staleness 4]

25 task sources whose generated lengths spread 90× and rollout durations 66× (log-uniform,
with per-group log-normal jitter), acceptance rates between 0.3 and 0.9, a target of 2
retained groups per source and step. Groups are executed by a simulated executor (each one
sleeps its drawn duration and returns sequences whose rewards make it accepted with the
source's probability), and everything else is the real code: ``Orchestrator`` (replay buffer,
staleness eviction, admission, ledger), ``SampleMixer`` (budget 1.25, p_max 2) and
``learning_signal``. The trainer step is a fixed sleep; in ``async`` mode (staleness 4) rollouts
keep running during it; ``sync`` trains on-policy (staleness 1).

Measured after two warm-up steps, side by side in one run: retained groups per minute, the
trainer's idle fraction, the work-conserving upper bound
``min(S·ΣB / Σ(B_i·t_i/r_i), ΣB / T_train)`` (S concurrent groups), the largest absolute error
of any source's retained share against its target share, and trained tokens over the
staleness bound. Writes ``results.json`` (``async_over_sync``, ``fraction_of_bound``,
``max_mixture_error``, ``staleness_violations``, …), ``results.md`` and ``scheduler.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rlonce.algo.signal import SignalSettings
from rlonce.core.records import Context, Role, Segment, Sequence
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings

N_SOURCES, TARGET, GROUP = 25, 2, 4


@dataclass(frozen=True)
class SimTask:
    task_id: str
    source: str


@dataclass(frozen=True)
class Source:
    name: str
    duration: float
    tokens: float
    acceptance: float


def workload(seed: int, t_min: float) -> list[Source]:
    rng = random.Random(seed)
    token_rank = list(range(N_SOURCES))
    rng.shuffle(token_rank)  # lengths spread 90×, not in step with durations
    out = []
    for i in range(N_SOURCES):
        x, y = i / (N_SOURCES - 1), token_rank[i] / (N_SOURCES - 1)
        out.append(Source(f"src{i:02d}", t_min * 66 ** x, 100 * 90 ** y, rng.uniform(0.3, 0.9)))
    return out


class SimExecutor:
    def __init__(self, sources: dict[str, Source], seed: int):
        self.sources = sources
        self.rng = random.Random(seed)
        self.version = 0

    async def run_group(self, group, group_size: int) -> list[Sequence]:
        src = self.sources[group.source]
        v0 = self.version
        await asyncio.sleep(src.duration * math.exp(self.rng.gauss(0, 0.3)))
        v1 = self.version  # a group that spans a weight update carries both versions
        accepted = self.rng.random() < src.acceptance
        rewards = [float(k % 2 == 0) for k in range(group_size)] if accepted else [0.0] * group_size
        seqs = []
        for r in rewards:
            ctx = Context([Segment(Role.PROMPT, [1, 2]), Segment(Role.MODEL, [3, 4, 5, 6], [-0.1] * 4,
                                                                 [v0, v0, v1, v1], "stop")])
            seqs.append(Sequence(group.task.task_id, "sim", [ctx], reward=r,
                                 metrics={"context_tokens": src.tokens, "model_tokens": 4.0}))
        return seqs


async def run_mode(mode: str, sources: list[Source], steps: int, train_s: float, slots: int, seed: int,
                   staleness: int) -> dict:
    mixer = SampleMixer({s.name: SourceStats(target=TARGET) for s in sources}, MixerSettings(budget=1.25, p_max=2.0))
    ex = SimExecutor({s.name: s for s in sources}, seed)
    orch = Orchestrator(ex, lambda source, i: SimTask(f"{source}/{i}", source), mixer, SignalSettings(),
                        OrchestratorSettings(mode=mode, group_size=GROUP, staleness=staleness,
                                             max_sessions=slots * GROUP))
    retained, idle, lags, ledgers = Counter(), 0.0, Counter(), []
    t_start = None
    busy: list[int] = []

    async def monitor():  # how many of the executor's group slots hold a running group
        while True:
            if t_start is not None:
                busy.append(len(orch.in_flight()))
            await asyncio.sleep(0.01)

    mon = asyncio.create_task(monitor())
    try:
        for step in range(1, steps + 1):
            if step == 3:
                t_start, idle, retained, lags = time.perf_counter(), 0.0, Counter(), Counter()
            t0 = time.perf_counter()
            res = await orch.collect(step)
            idle += time.perf_counter() - t0
            for x in res.samples:
                retained[x.source] += 1
            for r in res.rows:
                lags.update(ex.version - v for v, m in zip(r.policy_versions, r.loss_mask) if m)
            ledgers += [e.to_dict() for e in res.ledger.values()]
            await asyncio.sleep(train_s)  # the trainer; in async mode rollouts go on meanwhile
            ex.version += 1
        wall = time.perf_counter() - t_start
    finally:
        mon.cancel()
        await orch.close()
    total = sum(retained.values())
    share_target = 1 / len(sources)
    return {
        "mode": mode, "staleness": staleness, "measured_steps": steps - 2, "wall_s": wall,
        "retained_groups": total, "retained_groups_per_min": 60 * total / wall,
        "trainer_idle_fraction": idle / wall,
        "slot_utilization": sum(busy) / max(len(busy), 1) / slots,
        "max_mixture_error": max(abs(retained[s.name] / max(total, 1) - share_target) for s in sources),
        "staleness_violations": sum(n for lag, n in lags.items() if lag > staleness - 1),
        "version_lag_tokens": {str(k): v for k, v in sorted(lags.items())},
        "stale_dropped": sum(e["stale_dropped"] for e in ledgers),
        "dispatched": sum(e["dispatched"] for e in ledgers),
        "ledger_checked_records": len(ledgers),
        "mixer": {n: {"acceptance": round(s.acceptance, 3), "duration": round(s.duration, 3)}
                  for n, s in list(mixer.sources.items())[:3]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--train-s", type=float, default=0.4, help="simulated trainer step (seconds)")
    ap.add_argument("--staleness", type=int, default=4, help="async staleness bound (sync trains on-policy: 1)")
    ap.add_argument("--t-min", type=float, default=0.02, help="shortest source's mean group duration (seconds)")
    ap.add_argument("--slots", type=int, default=32, help="concurrent groups the executor may run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = workload(args.seed, args.t_min)
    res = {m: asyncio.run(run_mode(m, sources, args.steps, args.train_s, args.slots, args.seed,
                                   1 if m == "sync" else args.staleness)) for m in ("sync", "async")}
    jitter = math.exp(0.3 ** 2 / 2)  # mean of the log-normal jitter
    roll = args.slots * TARGET * N_SOURCES / sum(TARGET * s.duration * jitter / s.acceptance for s in sources)
    bound = 60 * min(roll, TARGET * N_SOURCES / args.train_s)
    summary = {
        "async_over_sync": res["async"]["retained_groups_per_min"] / res["sync"]["retained_groups_per_min"],
        "fraction_of_bound": res["async"]["retained_groups_per_min"] / bound,
        "max_mixture_error": max(r["max_mixture_error"] for r in res.values()),
        "staleness_violations": sum(r["staleness_violations"] for r in res.values()),
        "bound_retained_groups_per_min": bound,
        "workload": {"sources": N_SOURCES, "duration_spread": sources[-1].duration / sources[0].duration,
                     "tokens_spread": max(s.tokens for s in sources) / min(s.tokens for s in sources),
                     "target_groups_per_source": TARGET, "group_size": GROUP, "slots": args.slots,
                     "train_s": args.train_s},
        "modes": res,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    from rlonce.telemetry.bench import paired_bars, write_table

    rows = [[m, f"{r['retained_groups_per_min']:.0f}", f"{r['trainer_idle_fraction']:.2f}",
             f"{r['max_mixture_error']:.3f}", str(r["staleness_violations"]), str(r["stale_dropped"])]
            for m, r in res.items()]
    rows.append(["work-conserving bound", f"{bound:.0f}", "", "", "", ""])
    table = write_table(out / "results.md", ["mode", "retained groups / min", "trainer idle", "max mixture error",
                                             "tokens over staleness bound", "stale-dropped seqs"], rows)
    print(table)
    print(f"async/sync {summary['async_over_sync']:.2f}x; async at {summary['fraction_of_bound']:.0%} of the bound")
    paired_bars(out / "scheduler.png", ["retained groups / min"],
                {"sync": [res["sync"]["retained_groups_per_min"]], "async": [res["async"]["retained_groups_per_min"]],
                 "bound": [bound]}, ylabel="groups / min", title="25-source workload", log=False)


if __name__ == "__main__":
    main()
