"""Bad input to the CLI: one line on stderr naming the key, flag or file, exit code 2, no traceback.

The table runs the real console entry point (``python -m rlonce.cli``) once per case; every
case is refused before a model or torch loads, so the runs go four at a time. The tests after
it damage real run directories (a torn metrics line, a truncated trainer state, weights cut
short, a full disk) and resume them with the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pytest

GOOD_TASK = {"task_id": "t0", "package": "minipkg", "version": "0", "mutation": {}, "problem": "p", "f2p": [],
             "p2p": [], "hidden_files": {}}


def _files(root: Path) -> dict[str, str]:
    """Inputs some cases point at, made once in ``root``."""
    (root / "cfgdir").mkdir()
    (root / "latin1.toml").write_bytes(b"[rl]\nsteps = 3 # \xe9t\xe9\n")
    (root / "not_a_run").write_text("")
    for name, content in (("torn_cfg", "{"), ("list_cfg", "[1]")):
        (root / name).mkdir()
        (root / name / "config.json").write_text(content)
    pack = root / "pack"
    pack.mkdir()
    (pack / "pack.json").write_text('{"format": 1, "seed": 0, "tasks": 2, "packages": {}}\n')
    (pack / "tasks.jsonl").write_text(json.dumps(GOOD_TASK) + '\n{"task_id": "t1", "pack\n')
    return {"root": str(root), "pack": str(pack)}


# (case id, argv with {root}/{pack} placeholders, text the one line must contain)
CASES = [
    # config values (the findings of issue 15 first)
    ("group_size_negative", ["train", "rl.group_size=-2"], ["'rl.group_size' = -2", "[2, 1024]"]),
    ("group_size_one", ["train", "rl.group_size=1"], ["'rl.group_size' = 1", "[2, 1024]"]),
    ("rl_lr_negative", ["train", "rl.lr=-1"], ["'rl.lr' = -1", "(0, 1]"]),
    ("rl_lr_huge", ["train", "rl.lr=1e9"], ["'rl.lr' = 1000000000.0", "(0, 1]"]),
    ("rl_lr_inf", ["train", "rl.lr=inf"], ["'rl.lr' = inf", "(0, 1]"]),
    ("sft_lr_nan", ["train", "sft.lr=nan"], ["'sft.lr' = nan", "(0, 1]"]),
    ("checkpoint_every_zero", ["train", "checkpoint.every=0"], ["'checkpoint.every' = 0", "[1, 1000000]"]),
    ("sft_batch_rows_zero", ["train", "sft.batch_rows=0"], ["'sft.batch_rows' = 0", "[1, 65536]"]),
    ("max_tokens_per_turn_zero", ["train", "harness.max_tokens_per_turn=0"],
     ["'harness.max_tokens_per_turn' = 0", "[1, 1048576]"]),
    ("turn_longer_than_context", ["train", "harness.max_tokens_per_turn=4096"],
     ["harness.max_tokens_per_turn (4096) exceeds harness.max_context (1024)"]),
    ("temperature_zero", ["train", "harness.temperature=0"], ["'harness.temperature' = 0", "(0, 10]"]),
    ("top_p_zero", ["train", "harness.top_p=0"], ["'harness.top_p' = 0", "(0, 1]"]),
    ("top_p_above_one", ["quickstart", "harness.top_p=1.5"], ["'harness.top_p' = 1.5", "(0, 1]"]),
    ("eval_concurrency_zero", ["train", "eval.concurrency=0"], ["'eval.concurrency' = 0", "[1, 65536]"]),
    ("heldout_tasks_zero", ["train", "eval.heldout_tasks=0"], ["'eval.heldout_tasks' = 0", "[1, 1000000]"]),
    ("steps_negative", ["train", "rl.steps=-1"], ["'rl.steps' = -1", "[0, 1000000]"]),
    ("steps_huge_float", ["train", "rl.steps=1e30"], ["'rl.steps' = 1e+30", "[0, 1000000]"]),
    ("steps_boolean", ["train", "rl.steps=true"], ["'rl.steps' = 'true'", "valid integer"]),
    ("steps_word", ["train", "rl.steps=many"], ["'rl.steps' = 'many'", "valid integer"]),
    ("seed_negative", ["train", "runtime.seed=-1"], ["'runtime.seed' = -1", "[0, 4294967295]"]),
    ("oversampling_below_one", ["train", "rollout.oversampling=0.5"], ["'rollout.oversampling' = 0.5", "[1, 100]"]),
    ("timeout_minus_inf", ["train", "ray.call_timeout_s=-inf"], ["'ray.call_timeout_s' = -inf", "(0, 86400]"]),
    ("dual_clip_below_one", ["train", "algo.objective.clip_c=0.5"], ["'algo.objective.clip_c' = 0.5", "(1, 1000]"]),
    ("entropy_band_empty", ["train", "algo.objective=four_bound", "algo.objective.entropy_band=[0.8, 0.3]"],
     ["'algo.objective.entropy_band'", "[0.8, 0.3] is empty"]),
    ("length_ramp_inverted", ["train", "algo.length.deadzone=2"],
     ["algo.length.deadzone (2.0) must be below algo.length.saturation (1.0)"]),
    ("penalty_param_unknown", ["train", "algo.penalties=[{rule = 'repetition', rule_params = {bogus = 1}}]"],
     ["'algo.penalties'", "no parameter 'bogus'", "n, min_repeats"]),
    ("penalty_param_nan", ["train", "algo.penalties=[{rule = 'repetition', rule_params = {n = nan}}]"],
     ["'algo.penalties.rule_params.n' = nan", "finite"]),
    ("out_empty", ["train", "out="], ["'out' = ''"]),
    ("section_given_a_value", ["train", "rl=5"], ["'rl' is a section", "rl.steps="]),
    ("empty_key_part", ["train", "rl..steps=3"], ["'rl..steps=3' has an empty key part"]),
    ("not_key_value", ["quickstart", "steps"], ["'steps' is not key=value"]),
    ("eval_override_bad", ["eval", "--model", "embedded", "harness.temperature=-1"], ["'harness.temperature' = -1"]),
    # files given to train
    ("config_is_a_directory", ["train", "--config", "{root}/cfgdir"], ["{root}/cfgdir is a directory"]),
    ("config_not_a_regular_file", ["train", "--config", "/dev/null"], ["/dev/null is not a regular file"]),
    ("config_missing", ["train", "--config", "{root}/nope.toml"], ["{root}/nope.toml does not exist"]),
    ("config_not_utf8", ["train", "--config", "{root}/latin1.toml"], ["{root}/latin1.toml is not UTF-8"]),
    ("resume_a_file", ["train", "--resume", "{root}/not_a_run"], ["{root}/not_a_run is not a run directory"]),
    ("resume_torn_config", ["train", "--resume", "{root}/torn_cfg"],
     ["{root}/torn_cfg/config.json is not a usable saved config"]),
    ("resume_config_not_object", ["train", "--resume", "{root}/list_cfg"],
     ["{root}/list_cfg/config.json is not a usable saved config: not a JSON object"]),
    ("arms_bare_string", ["train", "harness.arms=mini-bash"], ["a list is needed", "harness.arms=[mini-bash]"]),
    ("audit_torn_config", ["audit", "{root}/torn_cfg"], ["{root}/torn_cfg/config.json cannot be read as JSON"]),
    ("audit_config_not_object", ["audit", "{root}/list_cfg"], ["{root}/list_cfg/config.json is not a JSON object"]),
    ("out_with_newline", ["train", "--out", "{root}/runs/a\nb"], ["--out", "holds a control character"]),
    ("out_override_with_tab", ["train", "out={root}/runs/a\tb"], ["config key 'out'", "control character"]),
    ("pack_with_newline", ["tasks", "validate", "{root}/pa\nck"], ["--pack", "control character"]),
    # flags
    ("serve_port_too_big", ["serve", "--model", "embedded", "--port", "99999"], ["--port: 99999", "0..65535"]),
    ("serve_port_negative", ["serve", "--model", "embedded", "--port", "-1"], ["--port: -1", "0..65535"]),
    ("serve_host_bad_ip", ["serve", "--model", "embedded", "--host", "256.1.1.1"], ["--host: '256.1.1.1'"]),
    ("serve_host_garbage", ["serve", "--model", "embedded", "--host", "my host!"], ["--host: 'my host!'"]),
    ("serve_host_unresolvable", ["serve", "--model", "embedded", "--host", "no-such-host.invalid"],
     ["cannot resolve --host 'no-such-host.invalid'"]),
    ("serve_host_not_local", ["serve", "--model", "embedded", "--host", "10.254.254.254", "--port", "18000"],
     ["cannot listen on 10.254.254.254:18000", "not an address of this machine"]),
    ("serve_port_in_use", ["serve", "--model", "embedded", "--port", "{port}"],
     ["cannot listen on 127.0.0.1:{port}: Address already in use", "choose another --port"]),
    ("serve_max_tokens_zero", ["serve", "--model", "embedded", "--max-tokens", "0"], ["--max-tokens: 0", "1..1048576"]),
    ("serve_max_context_zero", ["serve", "--model", "embedded", "--max-context", "0"], ["--max-context: 0"]),
    ("serve_prefix_cache_negative", ["serve", "--model", "embedded", "--prefix-cache-mb", "-1"],
     ["--prefix-cache-mb: -1", "[0, 1.04858e+06]"]),
    ("eval_tasks_zero", ["eval", "--model", "embedded", "--tasks", "0"], ["--tasks: 0", "1..1000000"]),
    ("eval_harness_tasks_negative", ["eval", "--model", "embedded", "--harness-tasks", "-3"], ["--harness-tasks: -3"]),
    ("eval_harness_timeout_nan", ["eval", "--model", "embedded", "--harness-timeout", "nan"],
     ["--harness-timeout: nan", "(0, 86400]"]),
    ("eval_harness_concurrency_zero", ["eval", "--model", "embedded", "--harness-concurrency", "0"],
     ["--harness-concurrency: 0", "1..64"]),
    ("build_per_package_zero", ["tasks", "build", "code", "--out", "{root}/built", "--per-package", "0"],
     ["--per-package: 0", "1..100000"]),
    ("build_unknown_package", ["tasks", "build", "code", "--out", "{root}/built", "--packages", "nope"],
     ["unknown package(s) nope"]),
    ("build_seed_word", ["tasks", "build", "code", "--out", "{root}/built", "--seed", "x"], ["--seed: 'x'"]),
    ("filter_k_zero", ["tasks", "filter", "reasoning", "--out", "{root}/f", "--k", "0"], ["--k: 0", "1..1024"]),
    ("filter_max_pass_zero", ["tasks", "filter", "reasoning", "--out", "{root}/f", "--max-pass", "0"],
     ["--max-pass: 0", "(0, 1]"]),
    ("validate_reruns_zero", ["tasks", "validate", "{pack}", "--reruns", "0"], ["--reruns: 0"]),
    ("validate_corrupt_tasks", ["tasks", "validate", "{pack}"], ["{pack}/tasks.jsonl line 2 is not a task"]),
    ("validate_missing_pack", ["tasks", "validate", "{root}/nopack"], ["{root}/nopack is not a task pack"]),
    ("probe_corrupt_tasks", ["probe", "code", "--pack", "{pack}"], ["{pack}/tasks.jsonl line 2 is not a task"]),
    ("probe_limit_zero", ["probe", "code", "--pack", "{pack}", "--limit", "0"], ["--limit: 0"]),
    ("probe_shard_past_n", ["probe", "code", "--pack", "{pack}", "--shard", "3/2"], ["--shard: '3/2' is not a shard"]),
    ("probe_shard_word", ["probe", "code", "--pack", "{pack}", "--shard", "half"], ["--shard: 'half'", "I/N"]),
    ("probe_record_unwritable", ["probe", "code", "--pack", "{pack}", "--record", "/proc/x.jsonl"],
     ["cannot write the probe record /proc/x.jsonl", "--record"]),
    ("unknown_verb", ["bogus"], ["invalid choice: 'bogus'"]),
    ("bad_mode", ["train", "--mode", "fast"], ["--mode: invalid choice: 'fast'"]),
]


def rlonce(*args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "rlonce.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def check_one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-1500:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlonce: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def table_results(tmp_path_factory):
    """Every case of the table run through the real CLI, four at a time."""
    where = _files(tmp_path_factory.mktemp("bad_input"))
    env = {**os.environ, "HOME": where["root"]}  # nothing lands in the real home
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    where["port"] = str(taken.getsockname()[1])

    def one(case):
        name, argv, needles = case

        def fill(text: str) -> str:
            for k, v in where.items():
                text = text.replace("{" + k + "}", v)
            return text

        argv = [fill(a) for a in argv]
        if argv[0] in ("train", "quickstart") and not any(a.startswith(("--out", "--resume", "out=")) for a in argv):
            argv += ["--out", f"{where['root']}/runs/{name}"]
        return name, (rlonce(*argv, env=env, cwd=where["root"]), [fill(n) for n in needles])

    with taken, ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, CASES))


def test_the_table_is_large_and_its_ids_unique():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(table_results, name):
    r, needles = table_results[name]
    check_one_line_error(r, *needles)


def test_config_error_names_key_value_and_bound_exactly(table_results):
    r, _ = table_results["rl_lr_huge"]
    assert r.stderr == ("rlonce: error: config key 'rl.lr' = 1000000000.0 is out of range: "
                        "use a finite value in (0, 1]\n")
    r, _ = table_results["serve_port_too_big"]
    assert r.stderr == ("rlonce: error: serve: argument --port: 99999 is out of range: use 0..65535 "
                        "(see `rlonce serve --help`)\n")


def test_refused_before_anything_is_written(table_results):
    """A refused config creates no run directory (nor any default one in the working directory); a
    refused pack build writes no pack."""
    root = Path(table_results["rl_lr_huge"][0].args[-1]).parents[1]
    assert sorted(p.name for p in root.iterdir()) == ["cfgdir", "latin1.toml", "list_cfg", "not_a_run", "pack",
                                                      "torn_cfg"]


# ---- damaged run directories ---------------------------------------------------------------

RUN_OVERRIDES = ["rl.steps=1", "eval.heldout_tasks=1", "eval.concurrency=1", "sft.demos=0", "checkpoint.keep=0"]


def make_run(out: Path, lm, steps: tuple[int, ...] = (1,)) -> Path:
    """A run directory as a run that finished its RL steps leaves it: config, checkpoints, metrics, ledger."""
    from rlonce.config import load_config, save_config
    from rlonce.recipes.grpo import RunState
    from rlonce.train import checkpoint

    cfg = load_config(None, [*RUN_OVERRIDES, f"out={out}"])
    out.mkdir(parents=True)
    save_config(cfg, out / "config.json")
    for step in steps:
        state = RunState(phase="rl", rl_step=step, data_position=8 * step, version=step, baseline_success=0.5,
                         baseline_per_arm={"mini-bash": 0.5})
        checkpoint.save(out, step, lm, run_state=asdict(state), rl_trainer=None, keep=0)
    return out


def test_jsonl_reader_drops_only_a_torn_last_line(tmp_path, capsys):
    from rlonce.telemetry.metrics import JsonlWriter, RunFileError, read_jsonl

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x": 3}\n{"step": 3, "x"')
    assert read_jsonl(p) == [{"step": 0, "x": 1}, {"step": 1, "x": 2}, {"step": 2, "x": 3}]
    assert capsys.readouterr().err == f"rlonce: warning: dropped the torn last line 4 of {p} (15 characters)\n"
    w = JsonlWriter(p, keep_until_step=1)
    w.write({"step": 2, "x": 9})
    w.close()
    assert p.read_text() == '{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x": 9}\n'
    p.write_text('{"step": 0}\n{"step": 1\n{"step": 2}\n')
    with pytest.raises(RunFileError, match=f"{p} line 2 is not a JSON object"):
        read_jsonl(p)


@pytest.mark.sandbox
def test_resume_after_a_torn_last_metrics_and_ledger_line(tmp_path, lm):
    run = make_run(tmp_path / "run", lm)
    (run / "metrics.jsonl").write_text('{"heldout_success": 0.5, "step": 0, "version": 0}\n'
                                       '{"reward_mean": 0.25, "step": 1, "version": 1}\n{"reward_mean": 0.3, "st')
    (run / "ledger.jsonl").write_text('{"dispatched": 16, "step": 1}\n{"dispatched": 1')
    r = rlonce("train", "--resume", str(run), "--quiet", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("rlonce: warning")]
    assert warnings == [f"rlonce: warning: dropped the torn last line 3 of {run}/metrics.jsonl (24 characters)",
                        f"rlonce: warning: dropped the torn last line 2 of {run}/ledger.jsonl (16 characters)"]
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 1] and metrics[-1]["final"] is True
    assert metrics[1] == {"reward_mean": 0.25, "step": 1, "version": 1}
    assert (run / "ledger.jsonl").read_text() == '{"dispatched": 16, "step": 1}\n'
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_steps"] == 1 and summary["baseline_success"] == 0.5 and summary["heldout_tasks"] == 1


def test_resume_from_a_truncated_trainer_state(tmp_path, lm):
    run = make_run(tmp_path / "run", lm, steps=(1, 2))
    state = run / "checkpoints" / "step-0002" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    line = check_one_line_error(rlonce("train", "--resume", str(run), "--quiet"))
    assert line.startswith(f"rlonce: error: checkpoint {state} does not load (truncated or corrupt: ")
    assert line.endswith(f"; delete {state.parent} to resume from step-0001, or start over without --resume")


def test_resume_from_cut_weights_names_the_checkpoint_and_what_to_do(tmp_path, lm):
    run = make_run(tmp_path / "run", lm)
    weights = run / "checkpoints" / "step-0001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    line = check_one_line_error(rlonce("train", "--resume", str(run), "--quiet"))
    assert line.startswith(f"rlonce: error: checkpoint {weights.parent} does not load (could not load the model in "
                           f"{weights.parent}")
    assert line.endswith("; start the run over without --resume (or with another --out)")


def test_resume_from_a_state_that_is_not_ours(tmp_path, lm):
    import torch

    run = make_run(tmp_path / "run", lm)
    state = run / "checkpoints" / "step-0001" / "trainer_state.pt"
    torch.save({"weights": [1, 2, 3]}, state)
    check_one_line_error(rlonce("train", "--resume", str(run), "--quiet"),
                         f"checkpoint {state} does not load (not an rlonce trainer state)")



@pytest.mark.parametrize("optimizer, says", [
    ({"optimizer": {"state": {}, "param_groups": []}, "step": 1}, "does not load (optimizer state: "),
    ({"optimizer_full": {}, "step": 1}, 'resume it with executor = "ray" and ray.trainer_workers > 1'),
])
def test_resume_from_an_optimizer_state_this_trainer_cannot_take(tmp_path, lm, optimizer, says):
    """A damaged optimizer state, or data-parallel ranks' one resumed by a single local trainer:
    one line naming the file or the setting, before any rollout."""
    import torch

    run = make_run(tmp_path / "run", lm)
    state = run / "checkpoints" / "step-0001" / "trainer_state.pt"
    saved = torch.load(state, weights_only=False)
    torch.save({**saved, "rl_trainer": optimizer}, state)
    line = check_one_line_error(rlonce("train", "--resume", str(run), "--quiet"), says)
    if "optimizer_full" not in optimizer:
        assert line.startswith(f"rlonce: error: checkpoint {state} does not load (optimizer state: ")


# ---- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A real filesystem of a given size (tmpfs), for ENOSPC without faking it; root only."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounts = []

    def make(size_mib: int) -> Path:
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(d)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounts.append(d)
        return d

    try:
        yield make
    finally:
        for d in mounts:
            if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(d)], check=False)  # still busy: detach it now, free it later


def test_checkpoint_larger_than_the_free_space_is_refused_before_writing(tiny_disk, lm):
    from rlonce.train import checkpoint

    disk = tiny_disk(1)
    (disk / "run" / "checkpoints" / ".tmp-step-0001").mkdir(parents=True)  # left by a killed run
    need = checkpoint.tensor_bytes(lm.model.state_dict()) + checkpoint.MARGIN_BYTES
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(disk / "run", 3, lm, run_state={}, rl_trainer=None)
    assert str(e.value) == (f"not enough disk space for checkpoint {disk}/run/checkpoints/step-0003: it needs about "
                            f"{need / 2**20:.1f} MiB, 1.0 MiB free; free space, lower checkpoint.keep or choose "
                            "another --out")
    assert list((disk / "run" / "checkpoints").iterdir()) == []


def test_disk_filling_up_during_the_write_removes_the_partial_checkpoint(tiny_disk, lm):
    """The estimate fits, the pickled run state does not: the write itself hits ENOSPC."""
    from rlonce.train import checkpoint

    disk = tiny_disk(12)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.save(disk / "run", 3, lm, run_state={"blob": "x" * (8 << 20)}, rl_trainer=None)
    msg = str(e.value)
    assert msg.startswith(f"disk full writing checkpoint {disk}/run/checkpoints/step-0003 after ")
    assert msg.endswith(", 12.0 MiB were free; free space, lower checkpoint.keep or choose another --out "
                        "(the partial checkpoint was removed)") and "\n" not in msg
    assert list((disk / "run" / "checkpoints").iterdir()) == []
    assert shutil.disk_usage(disk).used == 0
    assert checkpoint.save(disk / "run", 3, lm, run_state={}, rl_trainer=None).name == "step-0003"


@pytest.mark.sandbox
def test_full_disk_at_the_final_checkpoint_is_one_line_from_the_cli(tiny_disk, lm):
    disk = tiny_disk(14)
    run = make_run(disk / "run", lm)
    free = shutil.disk_usage(disk).free
    r = rlonce("train", "--resume", str(run), "--quiet", timeout=300)
    line = check_one_line_error(r, f"not enough disk space for checkpoint {run}/checkpoints/step-0001: it needs about ")
    assert line.endswith(" MiB free; free space, lower checkpoint.keep or choose another --out")
    assert float(line.split(", ")[1].split(" MiB free")[0]) <= round(free / 2**20, 1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0001"]
