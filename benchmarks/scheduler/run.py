"""The orchestrator under a synthetic 25-source workload and under the real job's sources.

    python benchmarks/scheduler/run.py --out DIR [--case all|synthetic|mixed] [--steps 40]
        [--train-s 0.4] [--staleness 4] [--sources-config configs/yoro.toml] [--measured RUN_DIR]

**synthetic.** 25 task sources whose generated lengths spread 90× and rollout durations 66×
(log-uniform, with per-group log-normal jitter), acceptance rates between 0.3 and 0.9, a target
of 2 retained groups per source and step. Groups are executed by a simulated executor (each one
sleeps its drawn duration and returns sequences whose rewards make it accepted with the
source's probability), and everything else is the real code: ``Orchestrator`` (replay buffer,
staleness eviction, admission, ledger), ``SampleMixer`` (budget 1.25, p_max 2) and
``learning_signal``. The trainer step is a fixed sleep; in ``async`` mode (staleness 4) rollouts
keep running during it; ``sync`` trains on-policy (staleness 1). Measured after two warm-up
steps, side by side in one run: retained groups per minute, the trainer's idle fraction, the
work-conserving upper bound ``min(S·ΣB / Σ(B_i·t_i/r_i), ΣB / T_train)`` (S concurrent groups),
the largest absolute error of any source's retained share against its target share, and trained
tokens over the staleness bound.

**mixed.** The job's own sources (``plan_sources`` of ``--sources-config``) through the job's
own orchestrator (``build_orchestrator``: each step's batch, ``rl.tasks_per_step`` in sync and
``rollout.target_groups`` in async, split by share in whole groups; per-source staleness, stale
policy and difficulty filter; the config's learning signal), only the domains and the executor
simulated. Each source's groups replay the per-step mean sequence seconds a real mixed run
measured (``--measured RUN_DIR``: its ``metrics.jsonl``, ``src/<label>/…``) with the same jitter
on top, are accepted with its measured acceptance ``1 - filtered / (dispatched - infra_failed)``
and fail as infrastructure at its measured rate; one time scale maps the slowest source's mean to
``--t-max`` seconds and the measured trainer step with it. Without a measured run the sources
take ``DEFAULTS`` (assumed, and said so). Departures: a group lasts its sequences' mean, not
their maximum; the simulated task ids never repeat, so the difficulty filter never skips (its
effect on acceptance is in the measurement); async waits at most ``--max-wait`` for a batch (the
job waits without bound), and the shortfall is counted.

A source measured to accept nothing (code for a tiny model: every group all-fail) cannot hold
its share in any mode; simulating it at 0 would only restate that. It is simulated at
``--acceptance-floor`` (0.05, the mixer's own floor) and marked, and two errors are reported:
``max_mixture_error`` over every source (retained share pooled over steps ``WARMUP``+1 to the
end, against the target share), and ``max_mixture_error_able`` over the sources measured above
the floor, with their target shares renormalised over them; ``groups_short`` counts the groups a
step's targets missed. Target: ≤ 0.05.

Writes ``results.json`` (``async_over_sync``, ``fraction_of_bound``, ``max_mixture_error``,
``staleness_violations``, …; the mixed case under ``mixed``), ``results.md`` (one table per
case), ``scheduler.png`` and ``mixture.png`` (retained share against target per source and step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rlonce.algo.signal import SignalSettings
from rlonce.config import load_config
from rlonce.core.records import Context, FailureCategory, Role, Segment, Sequence, Status
from rlonce.rollout.builders import build_orchestrator, signal_settings
from rlonce.rollout.mixer import MixerSettings, SampleMixer, SourceStats
from rlonce.rollout.orchestrator import Orchestrator, OrchestratorSettings
from rlonce.rollout.sources import SourcePlan, plan_sources

N_SOURCES, TARGET, GROUP = 25, 2, 4
WARMUP = 4
"""Mixed case: steps 1–4 warm the mixer's estimates; shares are measured from step 5 on."""


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
    durations: tuple[float, ...] = ()
    """Measured group durations, replayed at random (empty: ``duration``); the jitter goes on top."""
    infra: float = 0.0
    """Probability that a group fails as infrastructure (every sequence)."""


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
        base = self.rng.choice(src.durations) if src.durations else src.duration
        await asyncio.sleep(base * math.exp(self.rng.gauss(0, 0.3)))
        v1 = self.version  # a group that spans a weight update carries both versions
        if src.infra and self.rng.random() < src.infra:
            return [Sequence(group.task.task_id, "sim", status=Status.INFRA, failure=FailureCategory.HARNESS_ERROR)
                    for _ in range(group_size)]
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



# ---- the mixed case: the real job's sources, measured durations and acceptance ---------------
DEFAULTS = {"toolfind": (1.0, 0.6), "reasoning": (0.25, 0.5), "code": (3.0, 0.3)}
"""Without a measured run: a domain's mean group duration (relative) and acceptance, assumed."""


@dataclass(frozen=True)
class SimDomain:
    """What the orchestrator reads of a built domain: its task stream."""

    name: str

    def task(self, split: str, i: int) -> SimTask:
        return SimTask(f"{self.name}/{split}/{i}", self.name)


@dataclass(frozen=True)
class PlannedSource:
    """A source as ``build_orchestrator`` reads it: the job's real plan over a simulated domain."""

    plan: SourcePlan
    domain: SimDomain


def measured_sources(rows: list[dict]) -> dict[str, dict]:
    """Per source of a mixed run's ``metrics.jsonl`` rows (``src/<label>/…``), over the steps that
    dispatched it: each step's mean sequence seconds, acceptance ``1 - filtered / (dispatched -
    infra_failed)`` in sequences (exact in sync mode, where every group finishes within its step),
    the infrastructure-failure fraction, mean context tokens and retained groups."""
    labels = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("src/") and k.endswith("/dispatched")})
    out = {}
    for n in labels:
        k = f"src/{n}/"
        rs = [r for r in rows if r.get(k + "dispatched", 0) > 0]
        dispatched = sum(r[k + "dispatched"] for r in rs)
        infra = sum(r.get(k + "infra_failed", 0.0) for r in rs)
        filtered = sum(r.get(k + "filtered", 0.0) for r in rs)
        seconds = [r[k + "seconds_mean"] for r in rs if r.get(k + "seconds_mean", 0.0) > 0]
        tokens = [r[k + "context_tokens_mean"] for r in rs if r.get(k + "context_tokens_mean", 0.0) > 0]
        mean = sum(seconds) / len(seconds) if seconds else 0.0
        out[n] = {"steps": len(rs), "durations": seconds, "duration": mean,
                  "duration_cv": statistics.pstdev(seconds) / mean if mean else 0.0,
                  "acceptance": 1 - filtered / (dispatched - infra) if dispatched > infra else 0.0,
                  "infra": infra / dispatched if dispatched else 0.0,
                  "tokens": sum(tokens) / len(tokens) if tokens else 512.0,
                  "retained_groups": sum(r.get(k + "retained_groups", 0.0) for r in rs)}
    return out


def read_measured(run_dir: Path | None) -> tuple[dict[str, dict], float | None, str]:
    """A run directory's measured sources, its mean trainer-step seconds and where they came from."""
    path = run_dir / "metrics.jsonl" if run_dir is not None else None
    if path is None or not path.exists():
        return {}, None, f"no measured run ({path or 'none given'}): assumed defaults {DEFAULTS}"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if any(k.startswith("src/") for k in r)]  # the RL steps of a mixed run
    train = [r["train_seconds"] for r in rows if r.get("train_seconds")]
    return measured_sources(rows), sum(train) / len(train) if train else None, f"{path} ({len(rows)} steps)"


def mixed_workload(plans: list[SourcePlan], measured: dict[str, dict], t_max: float,
                   floor: float) -> tuple[dict[str, Source], dict[str, dict], float]:
    """Each plan's simulated source (measured, else ``DEFAULTS``), all durations scaled by one
    factor so the slowest source's mean group lasts ``t_max`` seconds; acceptance floored at
    ``floor``. Returns the sources, what each was built from and the time scale."""
    raw = {}
    for p in plans:
        m = measured.get(p.label)
        if m and m["durations"]:
            raw[p.label] = dict(m, origin="measured")
        else:
            d, a = DEFAULTS.get(p.options.name, (1.0, 0.5))
            raw[p.label] = {"durations": [], "duration": d, "duration_cv": 0.0, "acceptance": a, "infra": 0.0,
                            "tokens": 512.0, "origin": "default"}
    scale = t_max / max(v["duration"] for v in raw.values())
    sims = {n: Source(n, v["duration"] * scale, v["tokens"], max(v["acceptance"], floor),
                      tuple(x * scale for x in v["durations"]), v["infra"]) for n, v in raw.items()}
    kept = sum(v.get("retained_groups", 0.0) for v in raw.values())
    info = {n: {"origin": v["origin"], "duration_s": round(v["duration"], 3), "duration_cv": round(v["duration_cv"], 3),
                "acceptance": round(v["acceptance"], 3), "acceptance_simulated": round(sims[n].acceptance, 3),
                "floored": v["acceptance"] < floor, "infra": round(v["infra"], 3), "tokens": round(v["tokens"], 1),
                "measured_share": v["retained_groups"] / kept if kept and "retained_groups" in v else None}
            for n, v in raw.items()}
    return sims, info, scale


async def run_mixed(mode: str, config: Path, sims: dict[str, Source], steps: int, train_s: float, seed: int,
                    max_wait: float) -> dict:
    """The job's orchestrator (``build_orchestrator`` over ``config`` in ``mode``) on simulated
    sources: each step's per-source targets and retained groups."""
    cfg = load_config(config, [f"rollout.mode={mode}"])
    plans = plan_sources(cfg)
    ex = SimExecutor(sims, seed)
    orch = build_orchestrator(cfg, {p.label: PlannedSource(p, SimDomain(p.label)) for p in plans}, ex,
                              signal_settings(cfg.algo), lambda ids: " ".join(map(str, ids)))
    per_step, t0 = [], time.perf_counter()
    try:
        for step in range(1, steps + 1):
            t = time.perf_counter()
            res = await orch.collect(step, max_wait=max_wait if mode == "async" else None)
            idle = time.perf_counter() - t
            taken = Counter(x.source for x in res.samples)
            await asyncio.sleep(train_s)
            ex.version += 1
            per_step.append({"target": {n: int(s.target) for n, s in orch.mixer.sources.items()},
                             "retained": {p.label: taken[p.label] for p in plans}, "idle_s": idle,
                             "end_s": time.perf_counter() - t0})
    finally:
        await orch.close()
    return {"mode": mode, "batch": orch.s.batch, "plans": {p.label: (p.share, p.staleness) for p in plans},
            "per_step": per_step}


def mixture(run: dict, info: dict[str, dict], scale: float) -> dict:
    """Retained share per source over the steps after ``WARMUP`` (pooled: its retained groups over
    all retained groups) against its target share; the largest error over every source, and over
    the sources whose acceptance was measured above the floor (targets renormalised over them)."""
    steps = run["per_step"][WARMUP:]
    wall = steps[-1]["end_s"] - run["per_step"][WARMUP - 1]["end_s"]
    total = sum(sum(s["retained"].values()) for s in steps)
    rows = {}
    for n, (share, staleness) in run["plans"].items():
        got = sum(s["retained"][n] for s in steps)
        short = sum(max(0, s["target"][n] - s["retained"][n]) for s in steps)
        rows[n] = {"target_share": share, "retained_share": got / max(total, 1), "staleness": staleness,
                   "retained_groups": got, "groups_short": short}
        rows[n]["error"] = abs(rows[n]["retained_share"] - share)
    able = [n for n in rows if not info[n]["floored"]]
    able_total = sum(rows[n]["retained_groups"] for n in able)
    able_share = sum(rows[n]["target_share"] for n in able)
    return {"mode": run["mode"], "batch": run["batch"], "measured_steps": len(steps), "sources": rows,
            "max_mixture_error": max(r["error"] for r in rows.values()),
            "max_mixture_error_able": max((abs(rows[n]["retained_groups"] / max(able_total, 1)
                                               - rows[n]["target_share"] / able_share) for n in able), default=0.0),
            "able_sources": able, "groups_short": sum(r["groups_short"] for r in rows.values()),
            "retained_groups_per_real_min": 60 * total * scale / wall,
            "trainer_idle_fraction": sum(s["idle_s"] for s in steps) / wall, "per_step": run["per_step"]}


def plot_mixture(path: Path, res: dict[str, dict]) -> None:
    """Each source's retained share, pooled from the end of warm-up to each step, against its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res), figsize=(5.5 * len(res), 3.6), dpi=100, sharey=True, squeeze=False)
    for ax, (mode, r) in zip(axes[0], res.items()):
        steps = r["per_step"][WARMUP:]
        xs = list(range(WARMUP + 1, WARMUP + 1 + len(steps)))
        totals = [sum(s["retained"].values()) for s in steps]
        for k, (n, row) in enumerate(r["sources"].items()):
            got = [s["retained"][n] for s in steps]
            cum = [sum(got[:j + 1]) / max(sum(totals[:j + 1]), 1) for j in range(len(got))]
            ax.plot(xs, cum, color=f"C{k}", lw=2, label=f"{n} (target {row['target_share']:.2f})")
            ax.scatter(xs, [g / max(t, 1) for g, t in zip(got, totals)], color=f"C{k}", s=6, alpha=0.3)
            ax.axhline(row["target_share"], color=f"C{k}", ls="--", lw=1)
        ax.set_title(f"{mode}: max error {r['max_mixture_error']:.3f}")
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("retained share (line: pooled since warm-up; dots: per step)", fontsize=8)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def synthetic_case(args, out: Path) -> tuple[dict, str]:
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
    return summary, table


def mixed_case(args, out: Path) -> tuple[dict, str]:
    measured, train_measured, origin = read_measured(Path(args.measured) if args.measured else None)
    plans = plan_sources(load_config(args.sources_config))
    sims, info, scale = mixed_workload(plans, measured, args.t_max, args.acceptance_floor)
    train_s = train_measured * scale if train_measured else args.train_s
    print(f"mixed: {args.sources_config}; durations and acceptance from {origin}; time scale {scale:.4g}, "
          f"trainer step {train_s:.3f} s")
    res = {m: mixture(asyncio.run(run_mixed(m, Path(args.sources_config), sims, args.steps, train_s, args.seed,
                                            args.max_wait)), info, scale) for m in ("sync", "async")}
    floored = [n for n, v in info.items() if v["floored"]]
    summary = {"sources_config": str(args.sources_config), "measured": origin, "time_scale": scale, "train_s": train_s,
               "warmup_steps": WARMUP, "acceptance_floor": args.acceptance_floor, "floored": floored,
               "max_mixture_error": max(r["max_mixture_error"] for r in res.values()),
               "max_mixture_error_able": max(r["max_mixture_error_able"] for r in res.values()),
               "sources": info, "modes": res}
    from rlonce.telemetry.bench import write_table

    rows = []
    for m, r in res.items():
        for n, x in r["sources"].items():
            acc = f"{info[n]['acceptance']:.2f}" + (f" → {info[n]['acceptance_simulated']:.2f} (floor)"
                                                   if info[n]["floored"] else "")
            v = info[n]
            dur = f"{v['duration_s']:.3g}" + (" ± {:.0%}".format(v["duration_cv"]) if v["origin"] == "measured"
                                              else " (relative)")
            real = "" if v["measured_share"] is None else f"{v['measured_share']:.3f}"
            rows.append([m, n, v["origin"], dur, acc, str(x["staleness"]), f"{x['target_share']:.3f}", real,
                         f"{x['retained_share']:.3f}", f"{x['error']:.3f}", str(x["groups_short"])])
        rows.append([m, "**all**", "", "", "", "", f"batch {r['batch']}", "",
                     f"{r['retained_groups_per_real_min']:.1f} groups / real min", f"**{r['max_mixture_error']:.3f}**",
                     str(r["groups_short"])])
    table = write_table(out / "results.md", ["mode", "source", "from", "group s", "acceptance", "staleness",
                                             "target share", "measured run's share", "simulated share "
                                             f"(steps {WARMUP + 1}–)", "abs error", "groups short"], rows)
    note = (f"max mixture error {summary['max_mixture_error']:.3f} over all sources"
            + (f"; {summary['max_mixture_error_able']:.3f} over the sources whose acceptance was above the floor "
               f"({', '.join(res['sync']['able_sources'])}; targets renormalised over them); floored: "
               f"{', '.join(floored)}" if floored else ""))
    print(table)
    print(note)
    plot_mixture(out / "mixture.png", res)
    return summary, f"{table}\n\n{note}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", choices=("all", "synthetic", "mixed"), default="all")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--train-s", type=float, default=0.4,
                    help="simulated trainer step (seconds; mixed: only without a measured run)")
    ap.add_argument("--staleness", type=int, default=4, help="async staleness bound (sync trains on-policy: 1)")
    ap.add_argument("--t-min", type=float, default=0.02, help="shortest source's mean group duration (seconds)")
    ap.add_argument("--slots", type=int, default=32, help="concurrent groups the executor may run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources-config", default=str(Path(__file__).parents[2] / "configs" / "yoro.toml"),
                    help="mixed: the job config whose [[sources]] are planned")
    ap.add_argument("--measured", help="mixed: a run directory whose metrics.jsonl gives each source's durations, "
                                       "acceptance, infrastructure failures and tokens")
    ap.add_argument("--t-max", type=float, default=0.4, help="mixed: the slowest source's mean group duration (s)")
    ap.add_argument("--acceptance-floor", type=float, default=0.05,
                    help="mixed: least simulated acceptance (a source measured below it is floored and reported)")
    ap.add_argument("--max-wait", type=float, default=8.0, help="mixed, async: longest wait for a step's batch (s)")
    args = ap.parse_args()
    if args.case != "synthetic" and args.steps <= WARMUP:
        ap.error(f"the mixed case measures after {WARMUP} warm-up steps: --steps must be more")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, tables = {}, []
    if args.case in ("all", "synthetic"):
        s, t = synthetic_case(args, out)
        summary.update(s)
        tables.append(t)
    if args.case in ("all", "mixed"):
        s, t = mixed_case(args, out)
        summary["mixed"] = s
        tables.append(f"### mixed: the job's sources\n\n{t}")
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "results.md").write_text("\n\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
