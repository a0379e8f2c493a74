"""The main job's RL loop: one step is collect → train → publish → record, repeated to
``rl.steps`` with held-out evals and checkpoints between steps.

    orch.collect(step)      groups dispatched, graded, judged; TrainingRows (or remote payloads)
    backend.train(batch)    one optimizer step where the trainer lives (``rlonce.train.backend``)
    backend.publish(v + 1)  the new weights to every engine; later tokens carry v + 1
    step_record(...)        the per-step metrics record (``rlonce.telemetry.step``), the ledger,
                            the first trained group's trajectories, every trained row
                            (``rlonce.telemetry.rollouts``)

The loop reads and advances the job's ``RunState`` (step, data position, policy version,
bound-controller and orchestrator state), so a checkpoint between steps resumes it exactly.
"""

from __future__ import annotations

import gc
import logging
import math
import random
import resource
import time
from collections import Counter

from tqdm.auto import tqdm

from rlonce.core import faults
from rlonce.model import omp
from rlonce.rollout.orchestrator import Orchestrator, StepResult
from rlonce.telemetry.metrics import infra_causes
from rlonce.telemetry.rollouts import write_step
from rlonce.telemetry.step import StepInputs, per_source_success, step_record, untrained_line, write_trajectories
from rlonce.train.builders import rl_request

log = logging.getLogger(__name__)


async def train_step(job, res: StepResult, step: int) -> dict:
    """One trainer step on the step's batch in the job's trainer backend, then the new weights to
    the engines as ``version + 1`` (an entropy-bound controller updates its bounds in between)."""
    st, controller = job.state, job.ctx.controller
    bounds = controller.bounds() if controller is not None else None
    train_m = await job.backend.train(res, rl_request(job.cfg, res.row_count, step, st.version, bounds))
    faults.point("train.step")
    if controller is not None:
        train_m.update({f"bound_{k}": v for k, v in controller.update(train_m["entropy"]).items()})
        st.bounds = controller.state_dict()
    st.version += 1
    train_m["publish_bytes"] = float(await job.backend.publish(st.version))
    return train_m


async def rl_step(job, orch: Orchestrator) -> dict:
    """One RL step of ``job`` on ``orch``; returns the step's metrics record (also writes the
    ledger entries and the trajectories)."""
    cfg, st = job.cfg, job.state
    step = st.rl_step + 1
    t0 = time.perf_counter()
    job.threads("rollout")
    res = await orch.collect(step)
    t_roll = time.perf_counter() - t0
    if cfg.rollout.mode != "async":  # async: rollout goes on beside the trainer, on the rollout threads
        job.threads("train")
    t1 = time.perf_counter()
    trained_version = st.version
    train_m = await train_step(job, res, step) if res.row_count else {}
    lag_counts = Counter({int(k): n for k, n in train_m.pop("lag_counts", {}).items()})
    t_train = time.perf_counter() - t1
    st.orchestrator = orch.snapshot
    st.rl_step, st.data_position = step, sum(orch.snapshot["next_index"].values())
    samples, seqs = res.samples, res.finished
    for category, (n, cause) in infra_causes(seqs).items():
        log.warning("step %d: %d sequence(s) failed as %s; first cause: %s", step, n, category, cause)
    arms = sorted({a for x in job.sources.values() for a in x.plan.arms})
    shares = {n: x.plan.share for n, x in job.sources.items()}
    if line := untrained_line(step, res.ledger, Counter(x.source for x in samples), shares):
        log.warning("%s", line)  # a run that trains nothing says so at every step it does
    remote = bool(res.payloads and cfg.storage.remote_rows)  # the Ray executor's rows: in the object store
    rows = res.rows + ([r for p in res.payloads for r in p.fetch()[1]] if remote else [])
    violations = orch.staleness_violations(samples, rows, trained_version)
    rec = step_record(StepInputs(
        step=step, finished=seqs, trained=[s for x in samples for s in x.sequences], ledger=res.ledger,
        rollout_seconds=t_roll, train_seconds=t_train, retained_rows=res.row_count, version=st.version,
        violations=violations, replayed=orch.replayed, reissued=orch.reissued, arms=arms, lag_counts=lag_counts,
        finished_sources=res.finished_sources, shares=shares, taken_groups=Counter(x.source for x in samples)),
        res.metrics, train_m)
    if job.ctx.grading is not None:  # the trained tokens are known when every row is here (Ray: storage.remote_rows)
        trained = float(sum(len(r.token_ids) for r in rows)) if len(rows) == res.row_count else math.nan
        context = sum(s.metrics.get("context_tokens", 0.0) for s in seqs)
        rec.update(job.ctx.grading.step_metrics(t_roll, t_train, context, trained))
    if job.distill is not None:
        rec.update(job.distill.step_metrics())
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # this process's, so far
    for e in res.ledger.values():
        job.ledger.write(e.to_dict())
    faults.point("record.ledger")
    shown = samples[0].sequences if samples else seqs[:cfg.rl.group_size]
    if res.payloads and not any(s.contexts for s in shown):  # the first trained group's tokens are remote
        shown = res.payloads[0].fetch()[0]
    write_trajectories(job.out / "trajectories", step, shown, job.ctx.lm.decode)
    trainer_lp = None
    if hasattr(job.backend, "trained_logprobs") and res.rows and not remote:
        trainer_lp = job.backend.trained_logprobs()
    rec["rollouts_bytes"] = float(write_step(
        job.out, step, rows, samples, train_version=trained_version, rows_remote=res.row_count - len(rows),
        staleness={n: orch.staleness(n) for n in job.sources}, untrained=untrained_sample(job, res, step),
        trainer_logprobs=trainer_lp))
    return rec


def untrained_sample(job, res: StepResult, step: int) -> list:
    """``storage.untrained_fraction`` of the step's sequences it did not train on, by a draw seeded
    with the run's seed and the step (the same run stores the same ones) — or all of them on a
    step that trained no row, when they are the only record of what went wrong."""
    trained = {id(s) for x in res.samples for s in x.sequences}
    pool = [s for s in res.finished if id(s) not in trained]
    if res.row_count == 0:
        return pool
    k = round(job.cfg.storage.untrained_fraction * len(pool))
    picked = random.Random(job.cfg.runtime.seed * 1_000_003 + step).sample(range(len(pool)), k) if k else []
    return [pool[i] for i in sorted(picked)]


def settle() -> None:
    """Before a rollout loop: what setup loaded (libraries, the model, tasks) leaves the garbage
    collector's sight (``gc.freeze``), and this thread's OpenMP team goes (``rlonce.model.omp``). A
    full collection walks every tracked object: with transformers, the datasets and the run's tasks
    loaded, one took 0.32 s in the middle of an embedded-model rollout of 0.4 s."""
    gc.collect()
    gc.freeze()
    omp.release()


async def rl_phase(job) -> None:
    """RL steps until ``rl.steps``: an eval every ``eval.every`` steps and a checkpoint every
    ``checkpoint.every`` (the last step's eval and checkpoint are the job's final ones)."""
    cfg, st = job.cfg, job.state
    desc = "distill" if any(p.distills for p in job.plans) else "grpo"
    bar = tqdm(total=cfg.rl.steps, initial=st.rl_step, desc=desc, unit="step", disable=not job.progress,
               dynamic_ncols=True)
    orch = job.orchestrator()
    try:
        while st.rl_step < cfg.rl.steps:
            rec = await rl_step(job, orch)
            if cfg.eval.every and rec["step"] % cfg.eval.every == 0 and rec["step"] < cfg.rl.steps:
                ev = await job.evaluate_async(f"eval {rec['step']}", during=True)
                rec.update({"heldout_success": ev["success"], "heldout_reward": ev["reward"], **per_source_success(ev)})
            job.metrics.write(rec)
            bar.update(1)
            bar.set_postfix(reward=f"{rec['reward_mean']:.2f}", len=f"{rec['response_tokens_mean']:.0f}",
                            ent=f"{rec.get('entropy', 0):.2f}", s=f"{rec['step_seconds']:.1f}", refresh=False)
            if rec["step"] % cfg.checkpoint.every == 0 and rec["step"] < cfg.rl.steps:
                job.save_checkpoint()
    finally:
        bar.close()
        await orch.close()
