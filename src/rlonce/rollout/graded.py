"""Model graders in a run: each source's executor wrapped so a finished group is graded before it is
judged, and the step's grading metrics — counts, fallback and hack rates, agreement, cost shares.

``GradedExecutor`` runs the group (the wrapped executor), then ``Grader.grade_group``
(``rlonce.grading.graders``) on its sequences, in the group's own task: the other groups' rollouts
go on meanwhile, and a group enters the replay buffer judged. ``Grading.step_metrics`` turns what
the graders and judges counted since the last step into the record's ``grading/…``, ``judge_…``
and ``cost/…`` keys (docs/grading.md).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from pathlib import Path

from rlonce.config import RunConfig
from rlonce.errors import RlonceError
from rlonce.grading.build import build_judge
from rlonce.grading.graders import Grader, GradingSettings, kappa
from rlonce.grading.judge import FAILURES
from rlonce.grading.rubrics import load_rubrics
from rlonce.grading.verdicts import Rubrics

log = logging.getLogger(__name__)


class GradedExecutor:
    """``inner``'s groups, graded by ``grader`` once they ran (a local executor's sequences only)."""

    def __init__(self, inner, grader: Grader, clock: Counter):
        self.inner, self.grader, self.clock = inner, grader, clock

    def __getattr__(self, name):  # reserve, tickets, ...: the wrapped executor's
        return getattr(self.inner, name)

    async def run_group(self, group, group_size: int):
        t0 = time.perf_counter()
        out = await self.inner.run_group(group, group_size)
        self.clock["rollout"] += time.perf_counter() - t0
        if isinstance(out, list):
            await self.grader.grade_group(group.task, group.source, out, group.dispatch_step)
        return out


class PackRubrics:
    """GRS rubrics of pack tasks, read once per pack (``rlonce grade synthesize-rubrics`` writes them)."""

    def __init__(self):
        self.packs: dict[str, dict[str, Rubrics]] = {}

    def __call__(self, task) -> Rubrics | None:
        pack = getattr(task, "pack_dir", "")
        if not pack:
            return None
        if pack not in self.packs:
            try:
                self.packs[pack] = load_rubrics(pack)
            except RlonceError as e:
                self.packs[pack] = {}
                log.warning("%s: GRS falls back to test rewards", e)
        return self.packs[pack].get(getattr(task, "task_id", ""))


def attempt_files(statement: str, seqs) -> dict[str, str]:
    """An agentic grader's workspace files: the task and each attempt's change, side by side."""
    files = {"TASK.md": statement}
    for i, s in enumerate(seqs):
        if not s.infra_failed:
            files[f"attempts/{i}.{'diff' if s.artifact else 'txt'}"] = s.artifact or (s.answer or "")
    return files


class Grading:
    """The run's graders (one per source), their judges and the step metrics."""

    def __init__(self, cfg: RunConfig, sources: dict, decode, out: Path):
        g = cfg.grading
        record = out / "grading" / "calls.jsonl"
        self.judge = build_judge(g.judge, record)
        self.second = build_judge(g.agreement_judge, record, name="agreement")
        self.clock: Counter = Counter()
        self.table: Counter = Counter()  # the run's agreement pairs, for κ over the whole run
        settings = GradingSettings(grs=cfg.algo.grs, gar=cfg.algo.gar, audit_fraction=g.audit_fraction,
                                   audit_sources=tuple(g.audit_sources), agreement_fraction=g.agreement_fraction,
                                   deadline=g.deadline_s or None, seed=cfg.runtime.seed)
        rubrics = PackRubrics()
        self.graders = {}
        for label, src in sources.items():
            statement = (lambda f: lambda task: f(task).user_prompt())(src.domain.env_factory)
            workspace = ((lambda st: lambda task, seqs: attempt_files(st(task), seqs))(statement)
                         if g.judge.agentic else None)
            self.graders[label] = Grader(self.judge, settings, statement=statement, decode=decode, rubrics=rubrics,
                                         second=self.second, workspace=workspace)

    def wrap(self, label: str, executor) -> GradedExecutor:
        return GradedExecutor(executor, self.graders[label], self.clock)

    def step_metrics(self, rollout_seconds: float, train_seconds: float, rollout_tokens: float,
                     train_tokens: float) -> dict[str, float]:
        """The step's grading record: counts, rates, κ and the cost shares of wall time and tokens."""
        stats: Counter = Counter()
        for gr in self.graders.values():
            stats.update(gr.take_stats())
        judged = Counter(self.judge.take_counts())
        if self.second is not None:
            judged.update({k.replace("judge_", "agreement_judge_"): x for k, x in self.second.take_counts().items()})
        rec = {**stats, **judged}
        rec.update(_rates(stats, judged))
        pairs = {p: stats.get(f"grading/agreement_{p}", 0.0) for p in ("tt", "tf", "ft", "ff")}
        self.table.update(pairs)
        rec["grading/kappa"], rec["grading/kappa_run"] = kappa(pairs), kappa(self.table)
        n = sum(pairs.values())
        rec["grading/agreement_rate"] = (pairs["tt"] + pairs["ff"]) / n if n else math.nan
        rec.update(_cost(self.clock, stats.get("grading/seconds", 0.0), rollout_seconds, train_seconds,
                         rollout_tokens, judged.get("judge_tokens_in", 0.0) + judged.get("judge_tokens_out", 0.0),
                         train_tokens))
        self.clock.clear()
        return {k: x for k, x in rec.items() if not math.isnan(x)}


def _rates(stats: Counter, judged: Counter) -> dict[str, float]:
    calls = judged.get("judge_calls", 0.0)
    fails = sum(judged.get(f"judge_{c}", 0.0) for c in FAILURES)
    out = {"judge_failure_rate": fails / calls if calls else math.nan,
           "judge_parse_failure_rate": (judged.get("judge_non_json", 0.0) + judged.get("judge_invalid", 0.0)) / calls
           if calls else math.nan}
    audited = stats.get("grading/audited", 0.0)
    out["grading/hack_rate"] = stats.get("grading/audit_confirmed", 0.0) / audited if audited else math.nan
    eligible = stats.get("grading/audit_eligible", 0.0)
    out["grading/audit_coverage"] = audited / eligible if eligible else math.nan
    for key in [k for k in stats if k.startswith("grading/audited/")]:
        src = key.split("/", 2)[2]
        out[f"grading/hack_rate/{src}"] = stats.get(f"grading/audit_confirmed/{src}", 0.0) / stats[key]
    for part, asked in (("gar", stats.get("grading/gar_groups", 0.0)),
                        ("grs", stats.get("grading/grs_scored", 0.0) + _fallbacks(stats, "grs"))):
        out[f"grading/{part}_fallback_rate"] = _fallbacks(stats, part) / asked if asked else math.nan
    return out


def _fallbacks(stats: Counter, part: str) -> float:
    return sum(x for k, x in stats.items() if k.startswith(f"grading/{part}_fallback_"))


def _cost(clock: Counter, grading_s: float, rollout_s: float, train_s: float, rollout_tok: float, judge_tok: float,
          train_tok: float) -> dict[str, float]:
    """Shares of the step's wall time and tokens. Grading runs inside the rollout phase, beside other
    groups' rollouts: the phase's wall time is split between rollout and grading in proportion to
    the group-seconds each took."""
    busy = clock.get("rollout", 0.0) + grading_s
    grading_wall = rollout_s * grading_s / busy if busy else 0.0
    wall = rollout_s + train_s
    tokens = rollout_tok + judge_tok + train_tok
    return {"cost/grading_seconds": grading_wall,
            "cost/rollout_time_share": (rollout_s - grading_wall) / wall if wall else math.nan,
            "cost/grading_time_share": grading_wall / wall if wall else math.nan,
            "cost/train_time_share": train_s / wall if wall else math.nan,
            "cost/rollout_token_share": rollout_tok / tokens if tokens else math.nan,
            "cost/grading_token_share": judge_tok / tokens if tokens else math.nan,
            "cost/train_token_share": train_tok / tokens if tokens else math.nan}


def grading_totals(rows: list[dict]) -> dict[str, float]:
    """The run's grading in numbers (``summary.json``'s ``grading``): judge calls and each outcome,
    audits and confirmed hacks, fallbacks, κ over every pair, and the mean cost shares."""
    derived = ("grading/hack_rate", "grading/kappa", "grading/agreement_rate", "grading/audit_coverage")
    total: Counter = Counter()
    for r in rows:
        total.update({k: v for k, v in r.items() if isinstance(v, (int, float)) and not k.endswith("_rate")
                      and k.startswith(("judge_", "agreement_judge_", "grading/")) and not k.startswith(derived)})
    out = dict(total)
    pairs = {p: total.get(f"grading/agreement_{p}", 0.0) for p in ("tt", "tf", "ft", "ff")}
    out["kappa"] = kappa(pairs)
    out.update(_rates(total, total))
    for k in ("cost/rollout_time_share", "cost/grading_time_share", "cost/train_time_share",
              "cost/grading_token_share"):
        xs = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if xs:
            out[f"mean_{k.split('/')[1]}"] = sum(xs) / len(xs)
    return {k: v for k, v in sorted(out.items()) if not (isinstance(v, float) and math.isnan(v))}
