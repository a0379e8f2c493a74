"""The cyber domain through the real loop: clang-built targets, the sanitizer oracle in real
bubblewrap sandboxes, the scripted expert under several arms, the CLI verbs."""

import asyncio
import dataclasses
import json
import random

import pytest

from rlonce import cli
from rlonce.config import load_config
from rlonce.core.records import Sequence, Status
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.cyber.env import CyberEnv
from rlonce.envs.cyber.expert import expert_turns, function_lines
from rlonce.envs.cyber.validate import validated_tasks
from rlonce.envs.domains import domain_for
from rlonce.harness.arms import get_arm
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.rollout.runner import RolloutSpec, run_sequence

pytestmark = [pytest.mark.sandbox, pytest.mark.clang]


def test_the_pack_validates_every_bug_and_describes_it_from_its_report(cyber_pack):
    report = json.loads((cyber_pack / "validation.json").read_text())
    assert report["validated"] == report["tasks"] == 8 and report["dropped"] == {}
    tasks = validated_tasks(cyber_pack)
    assert len({t.kind for t in tasks}) >= 4
    for t in tasks:
        # the description names type, function and file, never the input or the maintainer's summary
        assert t.kind in t.description and t.function in t.description and t.file in t.description
        assert t.reference_poc().hex() not in t.description
    manifest = (cyber_pack / "targets" / "strutil" / "bugs.json").read_text()
    assert all(json.loads(manifest)[i]["summary"] not in t.description for i, t in enumerate(tasks))


@pytest.mark.parametrize("arm", ["mini-bash", "mini-claude-code", "mini-codex"])
def test_the_expert_reproduces_bugs_through_each_arm(lm, cyber_pack, arm):
    domain = domain_for(load_config(None, ["task.name=cyber", f"task.pack={cyber_pack}"]).task)
    spec = RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=get_format("hermes"),
                       sampling=SamplingParams(max_tokens=900), limits=HarnessLimits(max_turns=20), arms=(arm,),
                       max_context=8192)
    for i in range(2):
        task = domain.task("train", i)
        turns = expert_turns(task, random.Random(i), get_format("hermes"), translate=get_arm(arm).translate,
                             detour_p=0.5)
        seq = asyncio.run(run_sequence(task, domain.env_factory, ScriptedEngine(turns, lm.encode), spec, arm=arm))
        assert seq.status is Status.SUBMITTED and seq.reward == 1.0, (seq.cause, seq.transcript)
        assert "match" in seq.transcript and seq.metrics["run_target_calls"] >= 1


def test_run_target_shows_the_report_and_the_grader_reruns_the_pristine_binary(cyber_pack):
    task = validated_tasks(cyber_pack)[0]

    async def go():
        env = CyberEnv(task)
        await env.setup()
        try:
            src = await env.call_tool("bash", {"command": f"wc -l src/{task.file}"})
            poc = task.reference_poc()
            env.sandbox.put_file("poc.bin", poc)
            shown = await env.call_tool("bash", {"command": "run-target poc.bin"})
            direct = await env.call_tool("bash", {"command": f"/opt/target/{task.target} poc.bin"})
            seq = Sequence(task.task_id, "t")
            seq.answer = "poc.bin"
            good = await env.grade(seq)
            env.sandbox.put_file("empty.bin", b"")
            seq.answer = "empty.bin"
            bad = await env.grade(seq)
            return src, shown, direct, good, bad
        finally:
            await env.cleanup()

    src, shown, direct, good, bad = asyncio.run(go())
    assert src.split()[0].isdigit() and "[sanitizer report]" in shown and task.kind.split("-")[0] in shown
    assert "[sanitizer report]" not in direct  # the agent's own sandbox: the address-space cap stops ASan
    assert good.reward == 1.0 and good.passed and bad.reward == 0.0 and not bad.passed
    lo, hi = function_lines(task.source_file.read_text(), task.function)
    assert lo < hi and task.function in task.source_file.read_text().splitlines()[lo - 1]


def test_cli_build_validate_probe_and_a_missing_clang(tmp_path, capsys, monkeypatch, cyber_pack):
    assert cli.main(["tasks", "build", "cyber", "--out", str(tmp_path / "p"), "--targets", "calcvm", "--generated", "0",
                     "--quiet"]) == 0
    assert "wrote 8 tasks from 1 targets" in capsys.readouterr().out
    assert cli.main(["tasks", "build", "cyber", "--out", str(tmp_path / "q"), "--targets", "nope"]) == 2
    assert "unknown target(s) nope" in capsys.readouterr().err
    assert cli.main(["probe", "cyber", "--pack", str(cyber_pack), "--limit", "2", "--routes",
                     "other_bug_poc,fake_report_as_input", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["control_ok"] and report["holes"] == [] and report["rewarded"]["reference_poc"] == 2
    hostile = report["hostile_input"]  # the rule of blame, reported beside the routes
    assert hostile["episodes"] > 20 and hostile["infra"] == 0 and hostile["passed"] == 0
    assert cli.main(["probe", "cyber"]) == 2
    assert "needs --pack" in capsys.readouterr().err
    from rlonce.envs.cyber import build

    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert cli.main(["tasks", "build", "cyber", "--out", str(tmp_path / "r")]) != 0
    err = capsys.readouterr().err
    assert "apt-get install clang" in err and len(err.strip().splitlines()) == 1


def test_a_cyber_job_runs_end_to_end_on_a_validated_pack(tmp_path, cyber_pack):
    """``rlonce train`` on cyber (SFT from the expert, baseline, one GRPO step, final evaluation on
    the pack's held-out bugs, each once)."""
    out = tmp_path / "run"
    assert cli.main(["train", "configs/cyber.toml", "--out", str(out), "--quiet", f"task.pack={cyber_pack}",
                     "sft.demos=8", "sft.epochs=1", "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2",
                     "eval.heldout_tasks=100", "eval.every=0"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    split = json.loads((cyber_pack / "validation.json").read_text())["split"]
    assert summary["task"] == "cyber" and summary["heldout_tasks"] == len(split["heldout_ids"])
    assert summary["heldout_infra_failed"] == 0


def test_a_target_that_cannot_run_is_infrastructure_not_a_zero(tmp_path, cyber_pack):
    from rlonce.core.records import FailureCategory
    from rlonce.envs.base import grade_or_infra
    from rlonce.envs.cyber.oracle import HarnessBroken, run_input

    with pytest.raises(HarnessBroken, match="rebuild the pack"):
        asyncio.run(run_input(tmp_path / "missing", b"x"))
    not_exec = tmp_path / "strutil"
    not_exec.write_bytes(b"\x7fELF garbage")
    not_exec.chmod(0o644)
    with pytest.raises(HarnessBroken, match="did not start"):
        asyncio.run(run_input(not_exec, b"x"))
    task = validated_tasks(cyber_pack)[0]

    async def go():
        env = CyberEnv(task)
        await env.setup()
        try:
            env.sandbox.put_file("poc.bin", task.reference_poc())
            env.task = dataclasses.replace(task, pack_dir=str(tmp_path))  # the binary is gone
            seq = Sequence(task.task_id, "t")
            seq.answer = "poc.bin"
            return seq, await grade_or_infra(env, seq)
        finally:
            await env.cleanup()

    seq, grade = asyncio.run(go())
    assert grade is None and seq.status is Status.INFRA and seq.failure is FailureCategory.TESTBED_CORRUPTED


def test_a_target_that_spins_is_stopped_by_its_cpu_limit_and_reported_as_out_of_time(tmp_path):
    """The oracle's wall clock only catches waiting (a loaded host does not cut a run short); a
    run that computes forever is killed by its CPU limit and reads as timed out, a 0."""
    from rlonce.envs.cyber.oracle import run_input

    spin = tmp_path / "spin"
    spin.write_text("#!/bin/sh\nwhile :; do :; done\n")
    spin.chmod(0o755)
    run = asyncio.run(run_input(spin, b"x", seconds=1))
    assert run.timed_out and run.report is None and run.exit_code == 152
