"""A LoRA run of the embedded model (after a full SFT), named by a hub id from a Hugging Face cache the
test builds: two RL steps train the adapter alone, every publish sends the adapter's bytes, the engine
samples the trainer's policy (``mismatch_kl`` < 1e-6), the run audits clean, and ``rlonce eval``
loads an adapter checkpoint on its base."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rlonce.config import load_config
from rlonce.telemetry.metrics import read_jsonl

REPO_ID = "rlonce-tests/embedded-instruct"
RANK = 8
RUN = [f"model.name={REPO_ID}", f"model.lora.rank={RANK}", "model.lora.alpha=16", "sft.demos=0", "rl.steps=2",
       "rl.tasks_per_step=6", "rl.group_size=4", "rl.lr=1e-3", "eval.heldout_tasks=8", "eval.every=0",
       "checkpoint.every=1", "checkpoint.keep=0"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A full SFT of the embedded model (so that RL groups have contrast: LoRA SFT of this tiny model
    from scratch left held-out success at 0 in 2 epochs of 256 demonstrations), cached as
    ``REPO_ID``; then the LoRA run on it, named by the hub id, two RL steps."""
    from conftest import hub_cache
    from huggingface_hub import constants

    from rlonce.recipes.grpo import run

    root = tmp_path_factory.mktemp("lora")
    run(load_config(None, [f"out={root / 'sft'}", "sft.demos=256", "sft.epochs=2", "rl.steps=0",
                           "eval.heldout_tasks=4"]), progress=False)
    base = root / "base"
    shutil.copytree(root / "sft" / "checkpoints" / "step-0000", base,
                    ignore=shutil.ignore_patterns("trainer_state.pt", "provenance.json"))
    cache = root / "hf" / "hub"
    snapshot = hub_cache(cache, REPO_ID, base)
    out = root / "run"
    cfg = load_config(None, [f"out={out}", *RUN])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_CACHE", str(cache))
        summary = run(cfg, progress=False)
    return out, snapshot, base, summary, {"HF_HUB_CACHE": str(cache)}


def _adapter(ckpt) -> dict:
    return load_file(ckpt / "adapter_model.safetensors")


@pytest.mark.timeout(3600)
def test_a_lora_run_trains_the_adapter_and_publishes_its_bytes(lora_run):
    out, snapshot, base, summary, _ = lora_run
    assert summary["rl_steps"] == 2
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    adapter = _adapter(out / "checkpoints" / "step-0002")
    sent = sum(t.numel() * 4 for t in adapter.values())  # float32 A and B of every adapted layer
    assert {r["publish_bytes"] for r in steps} == {float(sent)}
    assert all(r["trained_tokens"] > 0 and r["mismatch_tokens"] > 0 for r in steps)
    assert all(0 <= r["mismatch_kl"] < 1e-6 for r in steps), [r["mismatch_kl"] for r in steps]
    # the checkpoints hold the adapter alone, on the hub snapshot as base
    ckpts = sorted((out / "checkpoints").glob("step-*"))
    for ck in ckpts:
        assert not (ck / "model.safetensors").exists() and (ck / "adapter_config.json").is_file()
        assert json.loads((ck / "adapter_config.json").read_text())["base_model_name_or_path"] == str(snapshot)
    # peft starts every B at zero (the adapted model is the base); RL moved every one of them, and
    # the base files are the cached ones, untouched
    first, last = _adapter(ckpts[0]), _adapter(ckpts[-1])
    assert [c.name for c in ckpts] == ["step-0000", "step-0001", "step-0002"]
    assert all(not bool(v.any()) for k, v in first.items() if "lora_B" in k)
    assert all(bool(v.any()) for k, v in last.items() if "lora_B" in k)
    assert (snapshot / "model.safetensors").read_bytes() == (base / "model.safetensors").read_bytes()


@pytest.mark.timeout(900)
def test_a_lora_run_audits_clean(lora_run):
    out, *_ = lora_run
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "audit", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every check passed" in r.stdout


@pytest.mark.timeout(900)
def test_rlonce_eval_loads_an_adapter_checkpoint_on_its_base(lora_run, tmp_path):
    out, _, _, _, env = lora_run
    ckpt = out / "checkpoints" / "step-0002"
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "eval", "--model", str(ckpt), "--tasks", "2",
                        "--out", str(tmp_path / "eval"), "--quiet"], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(1800)
def test_a_lora_run_killed_in_its_second_step_resumes_bit_identical(lora_run, tmp_path):
    """Deterministic mode (the default of a sync local run) with an adapter: SIGKILL after step 2's
    trainer step, ``--resume`` from step 1's adapter checkpoint (adapter loaded trainable on its
    base, optimizer state and RNG restored, the engine's weights W0 + s·B·A rebuilt from them):
    every checkpoint's adapter, every metric but time and the ledger equal the uninterrupted run's."""
    from conftest import untimed

    ref, _, _, _, env = lora_run
    out = tmp_path / "killed"
    environ = {**os.environ, **env}
    cli = [sys.executable, "-m", "rlonce.cli", "train"]
    r = subprocess.run([*cli, f"out={out}", *RUN, "--quiet"], capture_output=True, text=True, timeout=900,
                       env={**environ, "RLONCE_FAULTS": "train.step:2"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-0000", "step-0001"]
    r = subprocess.run([*cli, "--resume", str(out), "--quiet"], capture_output=True, text=True, timeout=900,
                       env=environ)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("step-0000", "step-0001", "step-0002"):
        a, b = _adapter(out / "checkpoints" / name), _adapter(ref / "checkpoints" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    for name in ("metrics.jsonl", "ledger.jsonl"):
        assert untimed(read_jsonl(out / name)) == untimed(read_jsonl(ref / name)), name

@pytest.mark.slow  # a Ray run (about 2 minutes on 2 cores); the adapter's cross-process merge is in test_lora.py
@pytest.mark.timeout(3600)
def test_a_lora_run_on_ray_with_two_data_parallel_trainers_audits_clean(lora_run, tmp_path):
    """Two FSDP2 trainer ranks train the adapter; each publish gathers its factors and puts them alone
    in the object store (no base weights), the engine actor merges them into its own base and
    samples the trainers' policy; the run audits clean and its checkpoints are the adapter."""
    pytest.importorskip("ray")
    from rlonce.recipes.audit import audit
    from rlonce.recipes.grpo import run

    _, _, base, _, _ = lora_run
    out = tmp_path / "ray"
    cfg = load_config(None, [f"out={out}", f"model.name={base}", f"model.lora.rank={RANK}", "model.lora.alpha=16",
                             "executor=ray", "ray.trainer_workers=2", "sft.demos=0", "rl.steps=2",
                             "rl.tasks_per_step=6", "rl.group_size=4", "rl.lr=1e-3", "eval.heldout_tasks=8",
                             "eval.every=0", "checkpoint.every=1"])
    summary = run(cfg, progress=False)
    assert summary["executor"] == "ray" and summary["rl_steps"] == 2
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    adapter = _adapter(out / "checkpoints" / "step-0002")
    assert {r["publish_bytes"] for r in steps} == {float(sum(t.numel() * 4 for t in adapter.values()))}
    trained = [r for r in steps if r["retained_rows"]]
    assert trained and all(0 <= r["mismatch_kl"] < 1e-6 for r in trained if r["mismatch_tokens"])
    assert all(bool(v.any()) for k, v in adapter.items() if "lora_B" in k)
    verdicts = audit(out)
    assert all(v.ok for v in verdicts), [v.line() for v in verdicts if not v.ok]
