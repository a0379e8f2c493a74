"""Rejection-sampling fine-tuning in a real run (issue 58, item 5): after SFT the embedded model
attempts training tasks in real sandboxes, its passing attempts are fine-tuned on, every attempt is
counted in RUN/rft.json and summary.json (slow suite), and a run that keeps nothing says so and
trains nothing."""

import json
import logging
from pathlib import Path

import pytest
import torch

from rlonce.config import load_config
from rlonce.recipes.grpo import Job
from rlonce.telemetry.metrics import read_jsonl

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]


def weights(job) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in job.ctx.lm.model.state_dict().items()}


def changed(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # a mixed SFT first (minutes on 2 cores): `make test-slow`
def test_rft_fine_tunes_on_the_models_own_passing_attempts_and_counts_every_attempt(tmp_path):
    cfg = load_config(REPO / "configs" / "tiny_mixed.toml", [f"out={tmp_path / 'run'}", "rl.steps=0",
                                                              "rft.tasks=6", "rft.samples=3", "rft.keep=2",
                                                              "sources.arith.rft_tasks=4"])
    job = Job(cfg, progress=False)
    job.start(False)
    job.sft()
    assert job.state.phase == "rft"
    before = weights(job)
    job.rft()
    after = weights(job)
    counts = json.loads((job.out / "rft.json").read_text())
    assert set(counts) == {"toolfind", "arith"}
    for label, tasks in (("toolfind", 6), ("arith", 4)):
        c = counts[label]
        assert (c["tasks"], c["attempts"]) == (tasks, 3 * tasks)
        assert c["kept"] + c["duplicates"] + c["over_keep"] + c["suspected"] == c["passed"]
        assert c["tasks_passed"] <= c["kept"] <= 2 * c["tasks_passed"]
    kept = sum(c["kept"] for c in counts.values())
    assert kept > 0, counts  # the embedded model after SFT passes some toolfind and arith tasks
    rows = read_jsonl(job.out / "rft" / "step-0000.jsonl")
    assert len(rows) == kept and all(r["status"] == "submitted" and r["reward"] > 0 for r in rows)
    assert all(v == [0] * len(v) for r in rows for v in r["turn_versions"])  # sampled by the SFT policy
    assert changed(before, after)
    assert job.state.phase == "rl"
    summary = job.run()  # from here: baseline (after RFT), no RL step, final
    assert summary["rft"] == counts
    assert summary["rl_steps"] == 0


def test_a_run_whose_attempts_all_fail_says_so_and_trains_nothing(tmp_path, caplog):
    # no SFT: the embedded model's untrained attempts at these arithmetic tasks fail
    cfg = load_config(None, [f"out={tmp_path / 'run'}", "task.name=reasoning", 'harness.arms=["single-turn"]',
                             'task.datasets=["chain_sum"]', "sft.demos=0", "rl.steps=0", "rft.tasks=3",
                             "rft.samples=2", "harness.max_tokens_per_turn=8"])
    job = Job(cfg, progress=False)
    job.start(False)
    before = weights(job)
    with caplog.at_level(logging.WARNING):
        summary = job.run()
    c = summary["rft"]["reasoning"]
    assert (c["attempts"], c["passed"], c["kept"]) == (6, 0, 0)
    assert "RFT TRAINED NOTHING" in caplog.text and "RFT kept no attempt of source reasoning" in caplog.text
    assert not changed(before, weights(job))
    assert read_jsonl(job.out / "rft" / "step-0000.jsonl") == []
