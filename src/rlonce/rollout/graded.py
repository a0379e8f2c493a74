"""Model graders in a run: each source's executor wrapped so a finished group is graded before it is
judged, and the step's grading metrics — counts, fallback and hack rates, agreement, cost shares.

``GradedExecutor`` runs the group (the wrapped executor), then ``Grader.grade_group``
(``rlonce.grading.graders``) on its sequences, in the group's own task: the other groups' rollouts
go on meanwhile, and a group enters the replay buffer judged. ``Grading.step_metrics`` turns what
the graders and judges counted since the last step into the record's ``grading/…``, ``judge_…``
and ``cost/…`` keys (docs/grading.md).

Under ``executor = "ray"`` each harness pool builds the run's graders and judges from the config
and grades its groups between rollout and judgement, where their tokens are
(``rlonce.dist.pools``); what it counted comes back with each group (``Judged.grading``) and the
driver's ``Grading`` adds it in. Each pool's judges keep their own cache and take an equal share of
the configured concurrency.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from pathlib import Path

from rlonce.config import RunConfig
from rlonce.config.grading import JudgeConfig
from rlonce.errors import RlonceError
from rlonce.grading.build import build_judge
from rlonce.grading.graders import Grader, GradingSettings, kappa
from rlonce.grading.judge import FAILURES
from rlonce.grading.rubrics import load_rubrics
from rlonce.grading.verdicts import Rubrics

log = logging.getLogger(__name__)
ROLLOUT_SECONDS = "rollout_seconds"
"""The counts' key of the group-seconds spent rolling out (beside ``grading/seconds``, grading's)."""


class GradedExecutor:
    """``inner``'s groups, graded by ``grader`` once they ran, their rollout's group-seconds added to
    ``counts``. A group ``inner`` graded and judged elsewhere (a Ray harness pool) comes back as a
    ``Judged`` holding what that process counted: that goes into ``counts`` instead."""

    def __init__(self, inner, grader: Grader, counts: Counter):
        self.inner, self.grader, self.counts = inner, grader, counts

    def __getattr__(self, name):  # reserve, tickets, ...: the wrapped executor's
        return getattr(self.inner, name)

    async def run_group(self, group, group_size: int):
        t0 = time.perf_counter()
        out = await self.inner.run_group(group, group_size)
        if isinstance(out, list):
            self.counts[ROLLOUT_SECONDS] += time.perf_counter() - t0
            await self.grader.grade_group(group.task, group.source, out, group.dispatch_step)
        elif out.grading:
            self.counts.update(out.grading)
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
    """The run's graders (one per source), their judges and the step metrics. ``processes``: how
    many processes grade at once, each with judges of its own (a Ray run's harness pools): each
    takes an equal share of a judge's ``concurrency``, at least one call."""

    def __init__(self, cfg: RunConfig, sources: dict, decode, out: Path, *, processes: int = 1):
        g = cfg.grading
        record = out / "grading" / "calls.jsonl"
        self.judge = build_judge(_share(g.judge, processes), record)
        self.second = build_judge(_share(g.agreement_judge, processes), record, name="agreement")
        self.counts: Counter = Counter()
        """Counted outside the graders and judges: the rollout clock and what harness pools sent."""
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
        return GradedExecutor(executor, self.graders[label], self.counts)

    def take_counts(self) -> dict[str, float]:
        """Everything counted since the last call, then zeroed: the graders' ``grading/…``, the
        judges' ``judge_…`` and ``agreement_judge_…``, the rollout group-seconds (``ROLLOUT_SECONDS``)
        and what harness pools sent. A harness pool sends this with each group it grades."""
        out = Counter(self.counts)
        self.counts.clear()
        for gr in self.graders.values():
            out.update(gr.take_stats())
        out.update(self.judge.take_counts())
        if self.second is not None:
            out.update({k.replace("judge_", "agreement_judge_"): x for k, x in self.second.take_counts().items()})
        return dict(out)

    def step_metrics(self, rollout_seconds: float, train_seconds: float, rollout_tokens: float,
                     train_tokens: float) -> dict[str, float]:
        """The step's grading record: counts, rates, κ and the cost shares of wall time and tokens
        (``train_tokens`` NaN: not known here, and the token shares are left out)."""
        counts = self.take_counts()
        rolling = counts.pop(ROLLOUT_SECONDS, 0.0)
        stats = Counter({k: x for k, x in counts.items() if k.startswith("grading/")})
        judged = Counter({k: x for k, x in counts.items() if not k.startswith("grading/")})
        rec = {**stats, **judged}
        rec.update(_rates(stats, judged))
        pairs = {p: stats.get(f"grading/agreement_{p}", 0.0) for p in ("tt", "tf", "ft", "ff")}
        self.table.update(pairs)
        rec["grading/kappa"], rec["grading/kappa_run"] = kappa(pairs), kappa(self.table)
        n = sum(pairs.values())
        rec["grading/agreement_rate"] = (pairs["tt"] + pairs["ff"]) / n if n else math.nan
        rec.update(_cost(rolling, stats.get("grading/seconds", 0.0), rollout_seconds, train_seconds,
                         rollout_tokens, judged.get("judge_tokens_in", 0.0) + judged.get("judge_tokens_out", 0.0),
                         train_tokens))
        return {k: x for k, x in rec.items() if not math.isnan(x)}


def _share(judge: JudgeConfig, processes: int) -> JudgeConfig:
    return judge.model_copy(update={"concurrency": max(1, judge.concurrency // processes)})


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


def _cost(rolling_s: float, grading_s: float, rollout_s: float, train_s: float, rollout_tok: float, judge_tok: float,
          train_tok: float) -> dict[str, float]:
    """Shares of the step's wall time and tokens. Grading runs inside the rollout phase, beside other
    groups' rollouts: the phase's wall time is split between rollout and grading in proportion to
    the group-seconds each took (``rolling_s``, ``grading_s``)."""
    busy = rolling_s + grading_s
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
