"""A run of the embedded sparse model (``model.name = "embedded-moe"``) under top-p sampling: the
engine records each token's experts, the trainer replays them (``mismatch_kl`` < 1e-6 at step 1,
where both hold the same weights), every step reports its expert load per layer in
``metrics.jsonl`` and ``report.html``, stored rollouts keep the experts per token, and the run
audits clean. Groups without contrast are trained too (``algo.filter_no_contrast = false``), so
each step runs the trainer's forward whatever the few SFT demonstrations taught."""

import json
import subprocess
import sys

import numpy as np
import pytest

from rlonce.config import load_config
from rlonce.telemetry.metrics import read_jsonl
from rlonce.telemetry.rollouts import read_step

RUN = ["model.name=embedded-moe", "harness.top_p=0.7", "sft.demos=64", "sft.epochs=1", "rl.steps=2",
       "rl.tasks_per_step=4", "rl.group_size=4", "algo.filter_no_contrast=false", "eval.heldout_tasks=4",
       "eval.every=0"]


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    from rlonce.recipes.grpo import run

    out = tmp_path_factory.mktemp("moe") / "run"
    run(load_config(None, [f"out={out}", *RUN]), progress=False)
    return out


@pytest.mark.timeout(1800)
def test_a_sparse_run_replays_routing_and_reports_expert_load(moe_run):
    steps = [r for r in read_jsonl(moe_run / "metrics.jsonl") if "mismatch_kl" in r]
    assert len(steps) == 2
    first = steps[0]
    assert first["mismatch_kl"] < 1e-6 and first["mismatch_tokens"] > 0
    for layer in range(4):
        for key in ("load_cv", "load_peak", "cold", "route_differ"):
            assert f"moe/l{layer}/{key}" in first
    assert 0 <= first["moe/route_differ"] < 0.1 and first["moe/load_peak"] >= 1.0
    page = (moe_run / "report.html").read_text()
    assert "Expert load: coefficient of variation" in page and "Routing: share of recorded tokens" in page
    _, cols = read_step(moe_run, 1)
    routes = cols["routes"]
    assert routes.shape[1:] == (4, 2) and ((routes == -1).all(axis=(1, 2)) | (routes >= 0).all(axis=(1, 2))).all()
    offsets, mask = cols["row_offsets"], cols["loss_mask"]
    for a, b in zip(offsets[:-1], offsets[1:]):  # recorded from the first token on; every model token but the last
        recorded = (routes[a:b] >= 0).all(axis=(1, 2))
        n = int(recorded.sum())
        assert recorded[:n].all() and n < b - a and (mask[a:b][:-1] == 0)[n:].all()
    assert np.unique(routes[routes >= 0]).size == 8  # every expert took some token


def test_a_sparse_run_audits_clean(moe_run):
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "audit", str(moe_run)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads((moe_run / "summary.json").read_text())["final_success"] is not None
