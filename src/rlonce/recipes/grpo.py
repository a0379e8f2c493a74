"""The main job: SFT from expert demonstrations, then GRPO in real sandboxes, with held-out evals.

    model ─► SFT on the scripted expert's demonstrations (run through the real harness)
          ─► baseline eval on held-out tasks (the SFT checkpoint)
          ─► RL steps: dispatch G sequences per task ─► grade ─► group advantages ─► filter
                       ─► TrainingRows ─► PPO-clip update ─► weights to the engine (version+1)
          ─► final eval on the same held-out tasks ─► summary.json, report.html

The RL loop itself is ``rlonce.recipes.rl``; SFT is ``rlonce.recipes.sft``, evaluation
``rlonce.recipes.evaluate``; training and weight publishing go through the trainer backend
(``rlonce.train.backend``).

Mode ``sync`` (colocated): each step's rollout finishes before its update, so every trained
token's version lag is 0; the ledger and the per-token versions record that rather than
assume it. Everything needed to resume is checkpointed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlonce.config import RunConfig, save_config
from rlonce.config.distill import is_endpoint
from rlonce.core import faults
from rlonce.dist.backends import build_backend
from rlonce.distill.executor import Distillation
from rlonce.model import loader, omp
from rlonce.recipes import provenance
from rlonce.recipes.context import RunContext, build_context
from rlonce.recipes.evaluate import heldout_success, keep_rows, outside_success, paired_change, write_rows
from rlonce.recipes.rft import attempt as rft_attempt
from rlonce.recipes.rft import describe as rft_describe
from rlonce.recipes.rft import plan_rft
from rlonce.recipes.rl import rl_phase, settle
from rlonce.recipes.sft import source_demonstrations, train_sft
from rlonce.rollout.builders import build_orchestrator
from rlonce.rollout.graded import grading_totals
from rlonce.rollout.orchestrator import Judge, Orchestrator
from rlonce.rollout.sources import Source, SourceExecutor, check_sources
from rlonce.sandbox.bwrap import find_bwrap
from rlonce.telemetry import rollouts
from rlonce.telemetry.metrics import JsonlWriter, read_jsonl
from rlonce.telemetry.report import write_report
from rlonce.telemetry.step import per_source_success, write_trajectories
from rlonce.telemetry.trackers import TrackedMetrics, Trackers
from rlonce.train import checkpoint
from rlonce.train.backend import TrainerBackend, TrainerStateError

log = logging.getLogger(__name__)


@dataclass
class RunState:
    phase: str = "sft"  # sft -> rft (when a source has rft_tasks) -> rl -> done
    rl_step: int = 0
    data_position: int = 0
    """Tasks drawn from the sources' train streams so far (all sources)."""
    version: int = 0
    baseline_success: float | None = None
    baseline_reward: float | None = None
    """Mean held-out reward of the baseline evaluation (a graded domain's score)."""
    baseline_per_arm: dict | None = None
    baseline_per_source: dict | None = None
    baseline_reward_per_source: dict | None = None
    wall_seconds_before: float = 0.0
    bounds: dict | None = None
    """State of the entropy-driven four-bound controller, when one is configured."""
    orchestrator: dict | None = None
    """The orchestrator's persisted state: mixer estimates, task positions."""
    records: dict | None = None
    """Lines of ``metrics.jsonl`` and ``ledger.jsonl`` when the checkpoint was written: a resumed
    run keeps exactly those, so no record is lost or written twice."""
    final: dict | None = None
    """The final evaluation, once done (phase 'done'): a run resumed after it only writes it out."""
    teacher_per_source: dict | None = None
    """Distillation: each distilled source's teacher on the same held-out tasks ({"success", "reward"})."""
    rft: dict | None = None
    """RFT's count of every attempt, per source (``rlonce.recipes.rft.select``), once it ran."""


class Job:
    """One run of the main job over ``cfg``. ``start`` builds its ``RunContext`` (``self.ctx``) once,
    from a fresh model or a checkpoint; the trainer backend starts from the weights SFT leaves."""

    def __init__(self, cfg: RunConfig, *, progress: bool = True, accept_changes: bool = False):
        self.plans = check_sources(cfg)
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.progress = progress
        self.accept_changes = accept_changes
        """Resume even though the code or the config changed (``--accept-changes``)."""
        self.t0 = time.perf_counter()
        self.ctx: RunContext | None = None
        self.state: RunState | None = None
        self.saved_trainer_state: dict | None = None
        """The optimizer state a resumed run continues from (handed to the trainer backend)."""
        self.resumed_from: Path | None = None
        self.backend: TrainerBackend | None = None
        self.engine = None
        self.config_json = cfg.model_dump(mode="json")
        self.provenance: dict = {}
        """RUN/provenance.json (``rlonce.recipes.provenance``)."""
        self.metrics: TrackedMetrics | None = None
        self.ledger: JsonlWriter | None = None
        self.distill: Distillation | None = None
        """The distilled sources' teachers and prefixes (``rlonce.distill``), built on first use."""

    # ---- set-up --------------------------------------------------------------------------
    @property
    def sources(self) -> dict[str, Source]:
        return self.ctx.sources

    def ensure_engine(self, engine_factory=None) -> None:
        """Start the trainer backend ``executor`` names (``rlonce.dist.backends``) from the current
        weights and optimizer state; ``self.engine`` is its engine. ``engine_factory(index)``
        replaces the configured engines (a benchmark's simulated model)."""
        if self.backend is not None:
            return
        try:
            ctx = self.ctx
            self.backend = build_backend(self.cfg, ctx.lm, ctx.model_dir, self.out, version=self.state.version,
                                         optim=ctx.optim, trainer_state=self.saved_trainer_state,
                                         judge=Judge(ctx.signal, self.cfg.harness.group_by_arm),
                                         engine_factory=engine_factory, say=self._say)
        except TrainerStateError as e:
            ckpt = self.resumed_from
            raise checkpoint.damaged(ckpt, ckpt / checkpoint.STATE_FILE, str(e)) from None
        self.engine = self.backend.engine

    @classmethod
    def for_model(cls, cfg: RunConfig, model: str, *, progress: bool = True) -> Job:
        """A job that only generates (evaluation, filtering) with ``model``; ``close()`` it."""
        job = cls(cfg, progress=progress)
        job.state = RunState()
        job.ctx = build_context(cfg, job.plans, loader.resolve(model, Path(cfg.out) / "cache"), job.out)
        job.ensure_engine()
        return job

    def close(self) -> None:
        gc.unfreeze()  # what ``settle`` froze can be collected again (a closed job's model is garbage)
        if self.distill is not None:
            self.distill.close()
            self.distill = None
        if self.backend is not None:
            self.backend.close()
            self.backend = self.engine = None

    def start(self, resume: bool) -> None:
        find_bwrap()
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(self.cfg.runtime.seed)
        random.seed(self.cfg.runtime.seed)
        if resume and not checkpoint.exists(self.out):  # killed before its first checkpoint: nothing to keep
            self._say(f"{self.out} has no checkpoint yet: starting it over")
            resume = False
        if resume:
            ckpt = checkpoint.latest(self.out)
            saved = checkpoint.load_state(ckpt)
            state_file = ckpt / checkpoint.STATE_FILE
            try:
                self.state = RunState(**saved["run_state"])
            except TypeError as e:
                raise checkpoint.damaged(ckpt, state_file, f"run state: {e}") from None
            try:
                self.ctx = build_context(self.cfg, self.plans, ckpt, self.out, bounds=self.state.bounds)
            except loader.ModelLoadError as e:
                raise checkpoint.damaged(ckpt, ckpt, str(e)) from None
            self.saved_trainer_state, self.resumed_from = saved.get("rl_trainer"), ckpt
            try:
                checkpoint.restore_rng(saved["rng"])
            except (KeyError, ValueError, RuntimeError, TypeError) as e:
                raise checkpoint.damaged(ckpt, state_file, f"RNG state: {str(e)[:160]}") from None
            keep = self.state.rl_step
            saved_config = json.loads((self.out / "config.json").read_text())
            self.provenance = provenance.check_resume(self.out, saved_config, self.config_json, keep,
                                                      self.accept_changes)
            provenance.write(self.out, self.provenance)
            rollouts.drop_after(self.out, keep)
            save_config(self.cfg, self.out / "config.json")  # overrides given at resume stay with the run
            self._say(f"resuming {self.out} from {ckpt.name} (phase {self.state.phase}, RL step {keep})")
        else:
            self.state = RunState()
            save_config(self.cfg, self.out / "config.json")
            model_dir = loader.resolve(self.cfg.model.name, self.out / "cache")
            self.ctx = build_context(self.cfg, self.plans, model_dir, self.out)
            self.provenance = provenance.record(self.cfg, self.config_json, model_dir)
            provenance.write(self.out, self.provenance)
            keep = 0
            for name in ("metrics.jsonl", "ledger.jsonl", "rft.json"):
                (self.out / name).unlink(missing_ok=True)
            for name in ("trajectories", "tensorboard", "rollouts", "rft"):
                shutil.rmtree(self.out / name, ignore_errors=True)
        trackers = Trackers(self.cfg, self.out, self.config_json, resume_step=keep if resume else None)
        lines = self.state.records or {}
        self.metrics = TrackedMetrics(JsonlWriter(self.out / "metrics.jsonl", keep_until_step=keep,
                                                  keep_lines=lines.get("metrics")), trackers)
        self.ledger = JsonlWriter(self.out / "ledger.jsonl", keep_until_step=keep, keep_lines=lines.get("ledger"))

    def _say(self, msg: str) -> None:
        if self.progress:
            tqdm.write(f"[rlonce] {msg}")

    def threads(self, kind: str) -> None:
        """Torch threads for ``kind`` ("rollout" or "train"), as ``runtime.*_threads`` says; going to
        rollout, this thread's OpenMP team goes: it would slow the engine's (``rlonce.model.omp``)."""
        torch.set_num_threads(getattr(self.cfg.runtime, f"{kind}_threads"))
        if kind == "rollout":
            omp.release()

    # ---- phases --------------------------------------------------------------------------
    def sft(self) -> None:
        self.threads("rollout")
        demos, epochs = source_demonstrations(self.sources.values(), self.ctx.fmt, self.ctx.lm.encode, self.cfg,
                                              progress=self.progress)
        self.threads("train")
        train_sft(self.ctx.lm.model, demos, self.cfg.sft, seed=self.cfg.runtime.seed, progress=self.progress,
                  epochs=epochs)
        if self.backend is not None:  # started before SFT: it takes the SFT weights
            self.drop_backend()
        self.state.phase = self.after_sft()
        self.save_checkpoint()

    def drop_backend(self) -> None:
        """Close the trainer backend and its engine, and free them now: an engine's caches live in
        reference cycles that only a full collection frees, and the next engine allocates its own."""
        self.backend.close()
        self.backend = self.engine = None
        gc.collect()

    def after_sft(self) -> str:
        return "rft" if any(p.rft_tasks for p in self.plans) else "rl"

    def rft(self) -> None:
        """Rejection-sampling fine-tuning (``rlonce.recipes.rft``): the model's own passing attempts
        at each source's first ``rft_tasks`` training tasks, fine-tuned on; every attempt counted in
        ``RUN/rft.json``, the kept ones in ``RUN/rft/step-0000.jsonl``. A source with nothing to keep
        says so; a run with nothing to keep says so loudly and goes on to RL from the SFT weights."""
        plan = plan_rft(self.cfg)
        self.ensure_engine()
        self.threads("rollout")
        found = asyncio.run(rft_attempt(self.sources, self.engine, plan, concurrency=self.cfg.eval.concurrency,
                                        progress=self.progress))
        for label, (_, counts) in found.items():
            self._say(rft_describe(label, counts))
            if not counts["kept"]:
                log.warning("RFT kept no attempt of source %s (%d of %d attempts passed): it fine-tunes on "
                            "nothing from this source", label, counts["passed"], counts["attempts"])
        kept = [s for seqs, _ in found.values() for s in seqs]
        self.drop_backend()  # the engine that RL starts takes the weights RFT leaves
        self.threads("train")
        if kept:
            train_sft(self.ctx.lm.model, kept, plan.sft, seed=plan.seed, progress=self.progress)
        else:
            log.warning("RFT TRAINED NOTHING: no attempt of any source was kept; RL starts from the SFT weights")
        self.state.rft = {label: counts for label, (_, counts) in found.items()}
        checkpoint.write_json(self.out / "rft.json", self.state.rft)
        write_trajectories(self.out / "rft", 0, kept, self.ctx.lm.decode)  # what it trained on, token by token
        self.state.phase = "rl"
        self.save_checkpoint()

    def evaluate(self, desc: str, *, n: int | None = None, during: bool = False) -> dict:
        return asyncio.run(self.evaluate_async(desc, n=n, during=during))

    async def evaluate_async(self, desc: str, *, n: int | None = None, during: bool = False) -> dict:
        """Held-out success of every source: its first ``n`` held-out tasks (default: the source's
        ``heldout_tasks``, or ``during_tasks`` with ``during``) under each of its arms. A source's
        ``success`` is the mean over its arms; the run's is the share-weighted mean over sources
        (``per_source`` has each; ``per_arm`` is keyed ``label/arm`` when there are several)."""
        self.ensure_engine()
        self.threads("rollout")
        per_source = {}
        for label, src in self.sources.items():
            count = n or (src.plan.during_tasks if during else src.plan.heldout_tasks)
            count = min(count, src.domain.heldout_size or count)  # a pack's held-out tasks, each once
            per_source[label] = await heldout_success(
                src.domain, self.engine, src.spec, count, desc if len(self.sources) == 1 else f"{desc} {label}",
                concurrency=self.cfg.eval.concurrency, progress=self.progress)
        keep_rows(self.out, desc, per_source)
        if len(per_source) == 1:
            return {**next(iter(per_source.values())), "per_source": per_source}
        return {"success": sum(self.sources[k].plan.share * v["success"] for k, v in per_source.items()),
                "reward": sum(self.sources[k].plan.share * v["reward"] for k, v in per_source.items()),
                "per_arm": {f"{k}/{a}": x for k, v in per_source.items() for a, x in v["per_arm"].items()},
                "tasks": sum(v["tasks"] for v in per_source.values()),
                "infra_failed": sum(v["infra_failed"] for v in per_source.values()), "per_source": per_source}

    async def evaluate_outside(self, command: str, name: str, n: int, timeout: float, concurrency: int = 2) -> dict:
        """Held-out success of an outside agent command, served over HTTP (``rlonce.harness.outside``)."""
        self.ensure_engine()
        self.threads("rollout")
        first = next(iter(self.sources.values()))  # an outside agent works on the first source's domain
        return await outside_success(first.domain, self.engine, first.spec, command, name, n, timeout,
                                     concurrency=concurrency, progress=self.progress)

    def orchestrator(self) -> Orchestrator:
        """The rollout orchestrator over this job's executor, restored to the run's position."""
        self.ensure_engine()
        distill = self.distillation()
        executors, pool_cap = {}, None
        for label, src in self.sources.items():
            executors[label], pool_cap = self.backend.executor(src.domain, src.spec)
            if distill is not None:  # the teacher scores a finished group before it is graded and judged
                executors[label] = distill.wrap(label, executors[label])
            if self.ctx.grading is not None:  # model graders grade each finished group before it is judged
                executors[label] = self.ctx.grading.wrap(label, executors[label])
        one = len({id(e) for e in executors.values()}) == 1  # Ray's pools run every source themselves
        executor = next(iter(executors.values())) if one else SourceExecutor(executors)
        settle()
        return build_orchestrator(self.cfg, self.sources, executor, self.ctx.signal, self.ctx.lm.decode,
                                  state=self.state.orchestrator, position=self.state.data_position,
                                  max_sessions=pool_cap)

    def distillation(self) -> Distillation | None:
        """The run's teachers (``rlonce.distill``; None when no source has one), loaded once."""
        if self.distill is None and any(p.distills for p in self.plans):
            self.ensure_engine()
            self.distill = Distillation.build(self.cfg, self.sources, self.ctx.lm, self.out / "cache", say=self._say,
                                              backend=self.backend)
        return self.distill

    async def evaluate_teachers(self) -> dict:
        """Each distilled source's teacher on the source's held-out tasks (the baseline's count), with
        the evaluation's seeds: what the student's recovery is measured against (``eval/teacher.jsonl``).
        An endpoint teacher only scores, so its sources are not evaluated (nor in the result)."""
        distill = self.distillation()
        self.threads("rollout")
        per_source = {}
        for label, src in self.sources.items():
            if not src.plan.distills or is_endpoint(src.plan.teacher):
                continue
            count = min(src.plan.heldout_tasks, src.domain.heldout_size or src.plan.heldout_tasks)
            per_source[label] = await heldout_success(
                src.domain, distill.engine_for(label), src.spec, count, f"teacher eval {label}",
                concurrency=self.cfg.eval.concurrency, progress=self.progress)
            distill.release_unused()  # one teacher's sampling caches at a time
        if per_source:
            keep_rows(self.out, "teacher eval", per_source)
        return {k: {"success": v["success"], "reward": v["reward"], "tasks": v["tasks"]} for k, v in per_source.items()}

    def _elapsed(self) -> float:
        return self.state.wall_seconds_before + (time.perf_counter() - self.t0)

    def save_checkpoint(self) -> None:
        """A checkpoint of the run as it is now: weights, optimizer, run state, RNG."""
        self.state.wall_seconds_before, self.t0 = self._elapsed(), time.perf_counter()
        # the backend holds the current weights and optimizer; before it starts, the run's own do
        trainer_state = self.backend.pull(self.ctx.lm.model) if self.backend is not None else self.saved_trainer_state
        if self.state.orchestrator:
            self.state.orchestrator = Orchestrator.materialize(self.state.orchestrator)
        if self.metrics is not None:
            self.state.records = {"metrics": self.metrics.jsonl.lines, "ledger": self.ledger.lines}
        meta = {"config_sha256": provenance.digest_json(self.config_json),
                "code_sha256": self.provenance.get("code", {}).get("source_sha256") if self.provenance else None}
        checkpoint.save(self.out, self.state.rl_step, self.ctx.lm, run_state=asdict(self.state),
                        rl_trainer=trainer_state, keep=self.cfg.checkpoint.keep, meta=meta)

    # ---- the whole job -------------------------------------------------------------------
    def run(self) -> dict:
        st = self.state
        if st.phase == "sft":
            demos = sum(p.sft_demos for p in self.plans if p.sft_epochs)
            if demos > 0:
                self._say(f"SFT on {demos} expert demonstrations")
                self.sft()
            else:
                st.phase = self.after_sft()
        if st.phase == "rft":
            self._say("RFT: the model's own passing attempts at training tasks, fine-tuned on")
            self.rft()
        try:
            return self._run_from_baseline()
        finally:
            self.close()

    def _run_from_baseline(self) -> dict:
        cfg, st = self.cfg, self.state
        self.ensure_engine()
        baseline = None
        if st.baseline_success is None:
            ev = baseline = self.evaluate("baseline eval")
            st.baseline_success, st.baseline_per_arm = ev["success"], ev["per_arm"]
            st.baseline_reward = ev["reward"]
            st.baseline_per_source = {k: v["success"] for k, v in ev["per_source"].items()}
            st.baseline_reward_per_source = {k: v["reward"] for k, v in ev["per_source"].items()}
            self.metrics.write({"step": 0, "heldout_success": ev["success"], "heldout_reward": ev["reward"],
                                "version": st.version, **per_source_success(ev)})
            self._say(f"baseline held-out success {ev['success']:.3f} on {ev['tasks']} tasks"
                      + "".join(f"; {k} {v:.3f}" for k, v in st.baseline_per_source.items() if len(self.sources) > 1))
            self.save_checkpoint()
        if st.teacher_per_source is None and any(p.distills for p in self.plans):
            st.teacher_per_source = asyncio.run(self.evaluate_teachers())
            said = "; ".join(f"{k} {v['success']:.3f}" for k, v in st.teacher_per_source.items())
            self._say(f"teacher held-out success {said}" if said else "no teacher to evaluate (endpoints only score)")
            self.save_checkpoint()
        if st.phase == "done" and st.rl_step < cfg.rl.steps:  # a finished run resumed to train on
            st.phase, st.final = "rl", None
        if st.final is None:  # (a checkpoint from before ``final`` was kept evaluates again)
            asyncio.run(rl_phase(self))
            if baseline is not None and cfg.rl.steps == 0:  # the same weights: evaluating again only costs time
                shutil.copyfile(self.out / "eval" / "baseline.jsonl", self.out / "eval" / "final.jsonl")
                st.final = baseline
                self._say("rl.steps = 0: the final evaluation is the baseline's (the weights did not change)")
            else:
                st.final = self.evaluate("final eval")
            st.phase = "done"
            self.save_checkpoint()  # then the records: a run killed past here resumes to write them once
        final = st.final
        self.metrics.write({"step": st.rl_step, "heldout_success": final["success"],
                            "heldout_reward": final.get("reward"), "version": st.version, "final": True,
                            **per_source_success(final)})
        wall = self._elapsed()
        ledger = read_jsonl(self.out / "ledger.jsonl")
        trained = trained_by_source(ledger, read_jsonl(self.out / "metrics.jsonl"), list(self.sources))
        summary = {
            "baseline_success": st.baseline_success,
            "final_success": final["success"],
            "improvement": final["success"] - st.baseline_success,
            "baseline_reward": st.baseline_reward,
            "final_reward": final.get("reward"),
            "heldout_tasks": final["tasks"],
            "heldout_infra_failed": final["infra_failed"],
            "rl_steps": st.rl_step,
            "steps_trained_nothing": steps_trained_nothing(ledger),
            "rft": st.rft,
            "policy_version": st.version,
            "wall_seconds": wall,
            "model": cfg.model.name,
            "task": "+".join(self.sources),
            "sources": {k: {"domain": v.plan.options.name, "share": v.plan.share, "arms": list(v.plan.arms),
                            "baseline_success": (st.baseline_per_source or {}).get(k),
                            "final_success": final["per_source"][k]["success"],
                            "baseline_reward": (st.baseline_reward_per_source or {}).get(k),
                            "final_reward": final["per_source"][k]["reward"],
                            "heldout_tasks": final["per_source"][k]["tasks"],
                            "heldout_change": paired_change(self.out / "eval" / "baseline.jsonl",
                                                            self.out / "eval" / "final.jsonl", source=k),
                            **trained[k], "audit_excluded": v.domain.audit_excluded,
                            **distill_summary(v.plan, (st.teacher_per_source or {}).get(k), final["per_source"][k],
                                              paired_change(self.out / "eval" / "teacher.jsonl",
                                                            self.out / "eval" / "final.jsonl", source=k))}
                        for k, v in self.sources.items()},
            "executor": cfg.executor,
            "harness_arms": sorted({a for v in self.sources.values() for a in v.plan.arms}),
            "final_success_per_arm": final["per_arm"],
            "baseline_success_per_arm": st.baseline_per_arm,
            "heldout_change": paired_change(self.out / "eval" / "baseline.jsonl", self.out / "eval" / "final.jsonl"),
        }
        if self.ctx.grading is not None:
            summary["grading"] = grading_totals(read_jsonl(self.out / "metrics.jsonl"))
        faults.point("summary")
        checkpoint.write_json(self.out / "summary.json", summary)
        write_report(self.out)
        self.metrics.close()
        self.ledger.close()
        return summary


def distill_summary(plan, teacher: dict | None, final: dict, vs_teacher: dict | None = None) -> dict:
    """A distilled source's part of ``summary.json``: its teacher, the teacher's held-out score on the
    same tasks, the recovery ratio (student after / teacher; None when the teacher scored 0) and
    ``vs_teacher``, the student's final attempts minus the teacher's on the same tasks, paired, with
    its standard error. A teacher that was not evaluated (``teacher`` None: an endpoint) has none."""
    if not plan.distills:
        return {}
    out = {"teacher": plan.teacher, "prefix": plan.prefix, "kl_weight": plan.kl_weight,
           "reward_weight": plan.reward_weight}
    if teacher is not None:
        out.update(teacher_success=teacher["success"], teacher_reward=teacher["reward"],
                   recovery=final["success"] / teacher["success"] if teacher["success"] > 0 else None,
                   recovery_reward=final["reward"] / teacher["reward"] if teacher["reward"] > 0 else None,
                   vs_teacher=vs_teacher)
    return out


def evaluate_model(cfg: RunConfig, model: str, tasks: int, *, progress: bool = True, harness_cmd: str | None = None,
                   harness_name: str = "outside", harness_tasks: int = 20, harness_timeout: float = 300.0,
                   harness_concurrency: int = 2) -> dict:
    """Held-out success of ``model`` ('embedded' or a folder) under each of ``cfg``'s harness
    arms and, with ``harness_cmd``, under an outside agent served over HTTP."""
    find_bwrap()
    job = Job.for_model(cfg, model, progress=progress)
    try:
        res = job.evaluate("eval", n=tasks)
        if harness_cmd:
            res["outside"] = asyncio.run(job.evaluate_outside(harness_cmd, harness_name, harness_tasks,
                                                              harness_timeout, harness_concurrency))
            write_rows(job.out / "eval" / f"{harness_name}.jsonl", res["outside"].pop("rows"), source=None)
            res["per_arm"][harness_name] = res["outside"]["success"]
        return res
    finally:
        job.close()


def run(cfg: RunConfig, *, resume: bool = False, progress: bool = True, accept_changes: bool = False) -> dict:
    """The job; ``resume`` continues ``cfg.out`` from its last checkpoint, refusing changed code or
    config unless ``accept_changes`` (``rlonce.recipes.provenance``)."""
    job = Job(cfg, progress=progress, accept_changes=accept_changes)
    job.start(resume)
    return job.run()


def trained_by_source(ledger: list[dict], metrics: list[dict], labels: list[str]) -> dict[str, dict]:
    """Per source, the run's ledger summed (sequences: dispatched, retained, filtered for no
    contrast — of those, in groups that all passed —, short groups), the groups it trained
    (``metrics.jsonl``'s ``src/<label>/retained_groups``; a one-source run's ``groups_taken``) and
    its share of every retained sequence: what a mixture was owed (``share``) beside what it
    trained (``trained_share``)."""
    keys = {"dispatched": "sequences_dispatched", "retained": "sequences_retained",
            "no_contrast_filtered": "sequences_no_contrast", "no_contrast_all_passed": "sequences_all_passed",
            "groups_short": "groups_short"}
    out = {k: dict.fromkeys(keys.values(), 0) | {"groups_retained": 0} for k in labels}
    for row in ledger:
        if row.get("source") in out:
            for k, name in keys.items():
                out[row["source"]][name] += row.get(k, 0)
    for rec in metrics:
        if "final" in rec or "reward_mean" not in rec:  # evaluation records
            continue
        for label, v in out.items():
            v["groups_retained"] += int(rec.get(f"src/{label}/retained_groups",
                                                rec.get("groups_taken", 0) if len(out) == 1 else 0))
    total = sum(v["sequences_retained"] for v in out.values())
    for v in out.values():
        v["trained_share"] = v["sequences_retained"] / total if total else 0.0
    return out


def steps_trained_nothing(ledger: list[dict]) -> int:
    """RL steps whose every source retained no sequence."""
    retained: dict[int, int] = {}
    for row in ledger:
        retained[row["step"]] = retained.get(row["step"], 0) + row.get("retained", 0)
    return sum(1 for n in retained.values() if n == 0)
