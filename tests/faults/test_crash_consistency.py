"""Crash consistency, proven by fault injection (`make test-faults`; docs/faults.md).

A reference run of the tiny mixed job goes uninterrupted. Another run of the same job is killed
with SIGKILL at 13 places in turn (``RLONCE_FAULTS``, ``rlonce.core.faults``) — inside SFT,
half-way through checkpoint writes, in the baseline and the mid-run evaluations, while a group is
graded, between a trainer step and its weight publication, while the engine is paused for new
weights, between the step's records, before the summary — and resumed with ``--resume`` after
each kill. Another is killed at random moments. Each must end equal to the reference bit for bit
(sync mode on the local executor is deterministic by default: ``runtime.deterministic``): every
checkpoint's weights, every metric but time, the ledgers, the stored rollouts; and
``rlonce audit`` passes. Then the failures a run lives through: a storm of sandbox, grader and
engine failures (each is infrastructure, counted, and the run goes on), and a disk that fills up
during a checkpoint (one line, the previous checkpoint still usable).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import untimed
from safetensors.torch import load_file

from rlonce.telemetry.metrics import read_jsonl

pytestmark = [pytest.mark.faults, pytest.mark.sandbox]
REPO = Path(__file__).resolve().parents[2]
JOB = [str(REPO / "configs" / "tiny_mixed.toml"), "rl.steps=3", "checkpoint.every=1", "checkpoint.keep=10",
       "eval.every=2", "storage.untrained_fraction=0.5"]
KILLS = [
    ("sft.batch:5", "inside SFT (no checkpoint yet: the resume starts over)"),
    ("checkpoint.weights", "the SFT checkpoint half written (still none usable)"),
    ("eval.sequence:3", "the baseline evaluation"),
    ("rollout.group:2", "step 1's rollouts"),
    ("grade:5", "grading a sequence of step 1"),
    ("train.step", "after the trainer's step, before publication"),
    ("publish", "the engine paused for new weights"),
    ("record.ledger", "the ledger written, the metrics not"),
    ("record.rollouts", "the rollout columns written, their .json not"),
    ("checkpoint.rename", "step 1's checkpoint complete but not in place"),
    ("checkpoint.prune", "step 1's checkpoint in place"),
    ("eval.sequence:2", "the evaluation after step 2"),
    ("summary", "the final checkpoint written, the summary not"),
]


def rlonce(*args, faults: str = "", timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLONCE_FAULTS": faults}
    return subprocess.run([sys.executable, "-m", "rlonce.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def assert_same_run(run: Path, ref: Path) -> None:
    """Bit for bit what the reference run made: weights, metrics, ledger, rollouts, summary."""
    names = sorted(p.name for p in (ref / "checkpoints").glob("step-*"))
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == names
    for name in names:
        a, b = (load_file(r / "checkpoints" / name / "model.safetensors") for r in (run, ref))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{name}: weights differ"
    for name in ("metrics.jsonl", "ledger.jsonl"):
        assert untimed(read_jsonl(run / name)) == untimed(read_jsonl(ref / name)), name
    for p in sorted((ref / "rollouts").glob("step-*.npz")):
        with np.load(p) as x, np.load(run / "rollouts" / p.name) as y:
            assert x.files == y.files and all(x[k].tobytes() == y[k].tobytes() for k in x.files), p.name
        js = p.with_suffix(".json").name
        assert untimed(json.loads((run / "rollouts" / js).read_text())) == untimed(
            json.loads((ref / "rollouts" / js).read_text())), js
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == sorted(p.name for p in (ref / "rollouts").iterdir())
    assert untimed(json.loads((run / "summary.json").read_text())) == untimed(
        json.loads((ref / "summary.json").read_text()))
    audit = rlonce("audit", str(run), timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "reference"
    r = rlonce("train", *JOB, f"out={out}", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_killed_at_13_places_and_resumed_each_time_ends_bit_identical(reference, tmp_path):
    run = tmp_path / "killed"
    first = True
    for point, where in KILLS:
        args = ("train", *JOB, f"out={run}", "--quiet") if first else ("train", "--resume", str(run), "--quiet")
        r = rlonce(*args, faults=point)
        assert r.returncode == -signal.SIGKILL, f"{point} ({where}) not reached: rc {r.returncode}\n{r.stderr[-2000:]}"
        first = False
    r = rlonce("train", "--resume", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_run(run, reference)


def test_killed_at_random_moments_and_resumed_ends_bit_identical(reference, tmp_path):
    """Up to five SIGKILLs at random times (seeded delays of 5-20 s, logged), each followed by a resume."""
    run, rng, kills = tmp_path / "random", random.Random(2026), []
    args = ["train", *JOB, f"out={run}", "--quiet"]
    while len(kills) < 5:
        proc = subprocess.Popen([sys.executable, "-m", "rlonce.cli", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        delay = rng.uniform(5.0, 20.0)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append(round(delay, 1))
        else:
            assert proc.returncode == 0, proc.stderr.read()[-2000:]
            break
        if (run / "config.json").is_file():  # else killed before the run wrote anything: start it again
            args = ["train", "--resume", str(run), "--quiet"]
    r = rlonce("train", "--resume", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"killed after {kills} s")
    assert kills, "the run finished before the first kill"
    assert_same_run(run, reference)


def _from_step_1(reference: Path, dest: Path) -> Path:
    """A copy of the reference run as it was at its step-1 checkpoint."""
    shutil.copytree(reference, dest)
    for p in (dest / "checkpoints").glob("step-*"):
        if p.name > "step-0001":
            shutil.rmtree(p)
    (dest / "summary.json").unlink()
    return dest


def test_a_storm_of_sandbox_grader_and_engine_failures_is_counted_as_infra_and_the_run_goes_on(reference, tmp_path):
    run = _from_step_1(reference, tmp_path / "storm")
    storm = "sandbox.exec:raise@0.15,grade:raise@0.2,engine.wave:raise@0.04"
    r = rlonce("train", "--resume", str(run), "--quiet", faults=storm)
    assert r.returncode == 0, r.stderr[-3000:]
    ledger = [e for e in read_jsonl(run / "ledger.jsonl") if e["step"] >= 2]
    seen = {}
    for e in ledger:
        for k, v in e["infra_by_category"].items():
            seen[k] = seen.get(k, 0) + v
        assert e["carried_in"] + e["dispatched"] == (e["infra_failed"] + e["no_contrast_filtered"]
                                                     + e["penalty_rejected"] + e["stale_dropped"] + e["retained"]
                                                     + e["carried_over"])
    assert {"sandbox_error", "grader_unavailable", "engine_error"} <= seen.keys(), seen
    assert sum(e["infra_failed"] for e in ledger) == sum(seen.values())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_steps"] == 3
    audit = rlonce("audit", str(run), timeout=300)
    assert audit.returncode == 0, audit.stdout


def test_a_disk_that_fills_during_a_checkpoint_stops_the_run_with_one_line_and_the_last_checkpoint_resumes(
        reference, tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    src = _from_step_1(reference, tmp_path / "copy")
    used = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    ckpt = sum(p.stat().st_size for p in (src / "checkpoints" / "step-0001").rglob("*") if p.is_file())
    size_mib = (used + ckpt // 2) // 2**20 + 1  # the run fits, its next checkpoint does not
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(disk)]).returncode == 0
    try:
        run = disk / "run"
        shutil.copytree(src, run)
        r = rlonce("train", "--resume", str(run), "--quiet")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
        assert r.stderr.startswith(("rlonce: error: disk full writing checkpoint",
                                    "rlonce: error: not enough disk space for checkpoint")), r.stderr
        assert "free space" in r.stderr
        assert not list((run / "checkpoints").glob(".tmp-*"))
        roomy = tmp_path / "roomy"
        shutil.copytree(run, roomy)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    time.sleep(0.1)
    r = rlonce("train", "--resume", str(roomy), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_run(roomy, reference)
