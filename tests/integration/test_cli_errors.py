"""Bad input gets one clear line on stderr, exit code 2, and no traceback."""

import importlib.util
import os
import subprocess
import sys

import pytest


def rlonce(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "rlonce.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def check_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-1500:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlonce: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_config_key(tmp_path):
    check_one_line_error(rlonce("quickstart", "--out", str(tmp_path / "o"), "rl.stepz=3"), "rl.stepz", "steps")


def test_malformed_toml(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[rl\nsteps=")
    check_one_line_error(rlonce("train", "--config", str(p), "--out", str(tmp_path / "o")), "not valid TOML")


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    check_one_line_error(rlonce("quickstart", "--out", str(blocker / "sub")), "cannot write to output directory")


def test_missing_bubblewrap(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(sys.executable, bindir / "python")
    env = {**os.environ, "PATH": str(bindir)}
    check_one_line_error(rlonce("quickstart", "--out", str(tmp_path / "o"), env=env), "bubblewrap", "apt-get install")


@pytest.mark.parametrize("kind", ["empty", "garbage", "nonexistent"])
def test_model_folder_that_does_not_load(tmp_path, kind):
    model = tmp_path / "model"
    if kind != "nonexistent":
        model.mkdir()
    if kind == "garbage":
        (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    check_one_line_error(rlonce("eval", "--model", str(model), "--out", str(tmp_path / "o"), "--tasks", "2"),
                         str(model))


def test_resume_without_a_run(tmp_path):
    check_one_line_error(rlonce("train", "--resume", str(tmp_path)), "not a run directory")


@pytest.mark.sandbox
def test_vllm_engine_without_vllm(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    check_one_line_error(rlonce("quickstart", "--out", str(tmp_path / "o"), "engine.backend=vllm"),
                         "needs vLLM", "pip install 'rlonce[vllm]'")


def test_vllm_engine_actor_without_a_gpu_is_refused(tmp_path):
    check_one_line_error(rlonce("quickstart", "--out", str(tmp_path / "o"), "--executor", "ray", "engine.backend=vllm"),
                         "ray.engine_gpus")


def test_eval_reads_a_config_file(tmp_path):
    """`rlonce eval` takes the run's config (task, arms) like `rlonce train`; two configs are an error."""
    cfg = tmp_path / "arith.toml"
    cfg.write_text('[task]\nname = "reasoning"\ndatasets = ["chain_sum"]\n[harness]\narms = ["single-turn"]\n'
                   'max_context = 512\n')
    r = rlonce("eval", "--model", "embedded", str(cfg), "--tasks", "2", "--out", str(tmp_path / "o"), "--quiet")
    assert r.returncode == 0, r.stderr[-1500:]
    assert "on 2 tasks" in r.stdout and "single-turn" in r.stdout, r.stdout
    check_one_line_error(rlonce("eval", "--model", "embedded", "--config", str(cfg), str(cfg), "--tasks", "2"),
                         "two configs given")


def test_sparse_only_settings_on_a_dense_model(tmp_path):
    check_one_line_error(rlonce("quickstart", "--out", str(tmp_path / "o"), "model.freeze_router=true",
                                "model.rollout_quant=mxfp4"),
                         "model.freeze_router and model.rollout_quant need a mixture-of-experts model", "'embedded'")
