"""``[grading]`` under ``executor = "ray"``: the same run, graded in the harness pools, gives the
numbers the local executor gives.

The model is a deterministic stand-in (``ArmModel``): in one turn it submits the toolfind task's
answer under the ``mini-mimocode`` arm and a tampering line under ``mini-bash``; with
``harness.assign = "sequence"`` the arms mix within a group, so every group has contrast and
what each sequence does depends only on its task and arm — not on which process runs it or in
what order. The scripted judge then audits (every pass, a seeded half of the rest, each twice for
the agreement check), compares the passing attempts of each group (GAR) and, for want of rubrics,
counts the GRS fallbacks. Both runs use the real sandbox, gateway, harness loop, judge, trainer and
ledger; the Ray run uses two harness pools, an engine actor and a trainer actor.
"""

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import slack

ray = pytest.importorskip("ray")

from rlonce.config import load_config  # noqa: E402
from rlonce.dist.cluster import RAY_SYSTEM_CONFIG, ray_temp_dir  # noqa: E402
from rlonce.recipes.grpo import Job  # noqa: E402
from rlonce.telemetry.metrics import read_jsonl  # noqa: E402

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RIGHT_ARM = "You are a coding agent with a file editor"
"""The start of ``mini-mimocode``'s preamble: the arm under which the model answers right."""
TAMPERING = "+import pytest"
"""The wrong answer: a line the scripted judge's hack rule flags (``rlonce.grading.scripted``)."""


class ArmModel:
    """Engine: one turn, ``submit`` of the task's answer (found by its question in the prompt) under
    the right arm, of ``TAMPERING`` under any other. Log-probs -0.5, version as loaded."""

    def __init__(self, model_dir: str, answers: dict[str, str]):
        from rlonce.model import loader
        from rlonce.model.chat import get_format

        lm = loader.load(model_dir, weights=False)
        self.encode, self.decode, self.fmt = lm.encode, lm.decode, get_format(lm.chat_format)
        self.answers = answers
        self.version = 0

    async def generate(self, prompt_ids, sampling, watch=None):
        from rlonce.engine.base import Generation, watch_after
        from rlonce.model.chat import ToolCall

        text = self.decode(prompt_ids)
        answer = next((a for q, a in self.answers.items() if q in text), "unknown")
        call = ToolCall("submit", {"answer": answer if RIGHT_ARM in text else TAMPERING})
        ids = self.encode(self.fmt.assistant_text("", [call]))[: sampling.max_tokens]
        return watch_after(Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop"), watch)

    def load_weights(self, state: dict, version: int) -> None:
        self.version = version

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ArmModelFactory:
    model_dir: str
    answers: dict

    def __call__(self, index: int) -> ArmModel:
        return ArmModel(self.model_dir, self.answers)


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engine actor builds ArmModel
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _system_config=RAY_SYSTEM_CONFIG,
             _temp_dir=str(ray_temp_dir(tmp_path_factory.mktemp("ray") / "ray")))
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _graded_run(out: Path, executor: str) -> tuple[list[dict], list[dict], list[dict], dict]:
    """A 2-step run of ``configs/tiny.toml`` with model graders on ``executor``: its step records,
    ledger, judge calls and summary."""
    cfg = load_config(REPO / "configs" / "tiny.toml", [
        f"out={out}", f"executor={executor}", "sft.demos=0", "rl.steps=2", "rl.tasks_per_step=4", "rl.group_size=4",
        "eval.heldout_tasks=2", "eval.every=0", "checkpoint.every=100", "runtime.deterministic=false",
        "harness.arms=[mini-bash,mini-mimocode]", "harness.assign=sequence", "harness.max_turns=1",
        "grading.judge.kind=scripted", "algo.gar=true", "algo.grs=true", "grading.audit_sources=[toolfind]",
        "grading.audit_fraction=0.5", "grading.agreement_fraction=1", "ray.harness_pools=2",
        f"ray.call_timeout_s={slack(120):.0f}", f"ray.group_timeout_s={slack(120):.0f}"])
    job = Job(cfg, progress=False)
    job.start(False)
    tasks = [job.ctx.domain.task(split, i) for split in ("train", "heldout") for i in range(32)]
    job.ensure_engine(engine_factory=ArmModelFactory(str(job.ctx.model_dir), {t.question: t.answer for t in tasks}))
    summary = job.run()
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    return steps, read_jsonl(out / "ledger.jsonl"), read_jsonl(out / "grading" / "calls.jsonl"), summary


VARIES = ("grading/seconds", "judge_seconds", "agreement_judge_seconds", "cost/grading_seconds")
"""Grading keys that are wall-clock times (with the time shares and their means)."""


def _timeless(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in VARIES and not k.endswith("_time_share")
            and not k.startswith("mean_")}


def _grading(rec: dict) -> dict:
    keep = ("grading/", "judge_", "agreement_judge_", "cost/")
    return _timeless({k: v for k, v in rec.items() if k.startswith(keep)})


def test_grading_on_ray_gives_the_local_executors_numbers(ray_instance, tmp_path):
    local = _graded_run(tmp_path / "local", "local")
    remote = _graded_run(tmp_path / "ray", "ray")
    (steps, ledger, calls, summary), (r_steps, r_ledger, r_calls, r_summary) = local, remote
    assert r_summary["executor"] == "ray" and len(steps) == len(r_steps) == 2
    for a, b in zip(steps, r_steps):
        assert _grading(a) == _grading(b)
        for k in ("reward_mean", "success_rate", "retained_rows", "hack_zeroed"):
            assert a.get(k) == b.get(k), k
    assert [{k: v for k, v in e.items() if k != "time"} for e in ledger] == \
        [{k: v for k, v in e.items() if k != "time"} for e in r_ledger]
    # what the judges were asked and answered, by both runs alike (in another order under Ray)
    asked = [Counter((c["judge"], c["kind"], c["sample"], c["outcome"], str(c["verdict"]), c["prompt"]) for c in x)
             for x in (calls, r_calls)]
    assert asked[0] == asked[1]
    assert _timeless(summary["grading"]) == _timeless(r_summary["grading"])
    # the run exercised every part: audits with confirmed hacks, agreement pairs, GAR, GRS fallbacks
    total = summary["grading"]
    assert total["grading/audited"] > 0 and total["grading/audit_confirmed"] > 0
    assert total["grading/agreement_tt"] > 0 and total["grading/agreement_ff"] > 0
    assert total["grading/gar_applied"] > 0 and total["grading/grs_fallback_no_rubrics"] > 0
    assert sum(r["retained_rows"] for r in steps) > 0
