"""``rlonce distill`` end to end on the embedded model: a teacher named by a run directory (its latest
checkpoint), the teacher's held-out score on the student's tasks, the reverse KL and the top-k term
in the metrics, the recovery ratio in summary.json, the teacher's top-k stored and shown by the
viewer, and an audit that recomputes every distilled token's advantage."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from rlonce.telemetry.metrics import read_jsonl

pytestmark = pytest.mark.sandbox


def test_rlonce_distill_runs_records_and_audits_clean_with_a_run_directory_as_teacher(embedded_dir, tmp_path):
    teacher = tmp_path / "teacher-run"
    for step in ("step-0001", "step-0003"):  # the latest is the teacher
        shutil.copytree(embedded_dir, teacher / "checkpoints" / step)
        torch.save({}, teacher / "checkpoints" / step / "trainer_state.pt")
    (teacher / "config.json").write_text("{}\n")  # a run directory holds the run's config, not a model's
    out = tmp_path / "distill"
    cli = [sys.executable, "-m", "rlonce.cli"]
    r = subprocess.run([*cli, "distill", "configs/tiny.toml", f"out={out}", f"model.name={embedded_dir}",
                        "sft.demos=0", f"distill.teacher={teacher}", "distill.topk=4", "rl.reward_weight=0",
                        "rl.steps=2",
                        "eval.heldout_tasks=4", "eval.every=0", "checkpoint.every=1", "--quiet"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "distill toolfind: teacher" in r.stdout
    src = json.loads((out / "summary.json").read_text())["sources"]["toolfind"]
    assert src["teacher"] == str(teacher) and src["prefix"] == "none" and src["reward_weight"] == 0.0
    assert src["teacher_success"] == src["baseline_success"]  # the same weights, the same seeded tasks
    assert (src["recovery"] is None) == (src["teacher_success"] == 0)
    assert src["vs_teacher"]["attempts"] == 4  # the same held-out tasks, paired
    assert len((out / "eval" / "teacher.jsonl").read_text().splitlines()) == 4
    _two_steps_at_the_teachers_weights_then_an_audit(out)
    from rlonce.recipes.view_data import RunView

    ctx = RunView(out).context(1, 0)  # rlonce view's token hover shows the teacher's log-prob and top-k
    assert [x is not None for x in ctx["teacher_logprobs"]] == [m == 1 for m in ctx["loss_mask"]]
    assert [x is not None for x in ctx["teacher_topk"]] == [m == 1 for m in ctx["loss_mask"]]
    assert all(len(t) == 4 and all(lp <= 0 for _, lp in t) for t in ctx["teacher_topk"] if t)


def test_rlonce_distill_without_a_teacher_says_what_to_set(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "distill", "configs/tiny.toml", f"out={tmp_path / 'x'}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "rlonce distill needs a teacher: set distill.teacher" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_rlonce_distill_on_ray_keeps_the_teacher_in_an_actor_and_audits_clean(embedded_dir, tmp_path):
    """executor = "ray": the teacher is an actor; harness pools score each group through it and
    replay its prefixes; the driver evaluates it through the same actor."""
    out = tmp_path / "ray"
    cli = [sys.executable, "-m", "rlonce.cli"]
    r = subprocess.run([*cli, "distill", "configs/tiny.toml", f"out={out}", f"model.name={embedded_dir}",
                        "executor=ray", "sft.demos=0", f"distill.teacher={embedded_dir}", "distill.prefix=teacher",
                        "rl.reward_weight=0", "rl.steps=2", "eval.heldout_tasks=4", "eval.every=0", "--quiet"],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    steps = [m for m in read_jsonl(out / "metrics.jsonl") if "reward_mean" in m]
    assert all(m["distill/teacher_rollouts"] == 2 and m["distill/forced_tokens"] > 0 for m in steps)
    assert abs(steps[0]["distill_reverse_kl"]) < 1e-5 < abs(steps[1]["distill_reverse_kl"])
    src = json.loads((out / "summary.json").read_text())["sources"]["toolfind"]
    assert src["teacher_success"] == src["baseline_success"]
    a = subprocess.run([*cli, "audit", str(out)], capture_output=True, text=True, timeout=600)
    assert a.returncode == 0, a.stdout


@pytest.mark.slow  # ~30 s on a loaded machine; the endpoint's scores are checked in the default suite
def test_rlonce_distill_from_an_endpoint_teacher_served_by_rlonce_serve(embedded_dir, tmp_path):
    """distill.teacher = http://…/v1: ``rlonce serve`` of the same weights scores the student's tokens
    (vLLM's prompt_logprobs); the endpoint is not evaluated, so the summary has no teacher score."""
    cli = [sys.executable, "-m", "rlonce.cli"]
    with open(tmp_path / "serve.err", "w") as err:
        serve = subprocess.Popen([*cli, "serve", "--model", str(embedded_dir), "--port", "0",
                                  "--out", str(tmp_path / "serve")], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        base = None
        for line in serve.stdout:  # "rlonce gateway for embedded at http://127.0.0.1:PORT"
            if m := re.search(r" at (http://127\.0\.0\.1:\d+)$", line.strip()):
                base = m.group(1)
                break
        assert base, (tmp_path / "serve.err").read_text()[-2000:]
        out = tmp_path / "distill"
        r = subprocess.run([*cli, "distill", "configs/tiny.toml", f"out={out}", f"model.name={embedded_dir}",
                            "sft.demos=0", f"distill.teacher={base}/v1", "distill.teacher_model=embedded",
                            "rl.reward_weight=0", "rl.steps=2", "eval.heldout_tasks=2", "eval.every=0", "--quiet"],
                           capture_output=True, text=True, timeout=900)
    finally:
        serve.terminate()
        serve.wait(timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "distill toolfind: teacher not evaluated (an endpoint), student" in r.stdout
    src = json.loads((out / "summary.json").read_text())["sources"]["toolfind"]
    assert src["teacher"] == f"{base}/v1" and src["reward_weight"] == 0.0
    assert "teacher_success" not in src and "recovery" not in src
    assert not (out / "eval" / "teacher.jsonl").exists()
    _two_steps_at_the_teachers_weights_then_an_audit(out)  # the endpoint serves the student's weights


def _two_steps_at_the_teachers_weights_then_an_audit(out) -> None:
    """Two distilled steps, the first sampled from the teacher's own weights (its reverse KL is
    round-off), and ``rlonce audit`` recomputing every distilled token's advantage."""
    steps = [m for m in read_jsonl(out / "metrics.jsonl") if "reward_mean" in m]
    assert len(steps) == 2 and all(m["src/toolfind/distill_tokens"] > 0 for m in steps)
    assert abs(steps[0]["distill_reverse_kl"]) < 1e-5 and steps[0]["retained_rows"] > 0
    assert abs(steps[0]["distill_topk_kl"]) < 1e-5 < steps[1]["distill_topk_kl"]  # distill.topk: 0 at equal weights
    a = subprocess.run([sys.executable, "-m", "rlonce.cli", "audit", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert a.returncode == 0, a.stdout
    assert "[ok  ] advantages" in a.stdout
