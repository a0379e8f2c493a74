"""``benchmarks/harness_transfer/run.py`` (issue 58, item 4): every trained arm gets the control's
demonstrations and groups, the paired tables by hand, and the whole benchmark on the embedded model
(a held-out built-in arm and mini-swe-agent over HTTP; slow suite), run again without rerunning an arm."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

PATH = Path(__file__).parents[2] / "benchmarks" / "harness_transfer" / "run.py"

TOML = """
[model]
name = "embedded"

[task]
name = "toolfind"

[harness]
arms = ["mini-bash", "mini-claude-code", "mini-mimocode"]
max_turns = 4

[sft]
demos = 12
epochs = 1
detour_p = 0.0

[rl]
steps = 1
tasks_per_step = 1
group_size = 2

[eval]
heldout_tasks = 2
every = 0

[benchmark]
seeds = [0]
heldout_tasks = 3
outside_tasks = 2
outside_concurrency = 2
outside_timeout = 120
"""


@pytest.fixture(scope="module")
def bench(script_module):
    return script_module(PATH, "transfer_bench")


def test_every_trained_arm_gets_the_controls_demonstrations_and_groups(bench, tmp_path):
    data, b, run = bench.split(tomllib.loads(TOML), ["benchmark.seeds=[3, 4]", "rl.steps=2"])
    assert (b.seeds, b.heldout_arm, b.heldout_tasks, b.outside_tasks) == ((3, 4), "mini-codex", 3, 2)
    assert run == ["rl.steps=2"] and "benchmark" not in data
    assert bench.arm_names(b) == ["multi-s3", "one-s3", "multi-s4", "one-s4"]
    multi = bench.arm_config("multi-s3", data, run, tmp_path)
    one = bench.arm_config("one-s3", data, run, tmp_path)
    assert multi.harness.arms == ["mini-bash", "mini-claude-code", "mini-mimocode"]
    assert one.harness.arms == ["mini-bash"]
    assert (multi.sft.demos, multi.rl.tasks_per_step) == (36, 3) and (one.sft.demos, one.rl.tasks_per_step) == (12, 1)
    assert multi.runtime.seed == one.runtime.seed == 3 and multi.rl.steps == one.rl.steps == 2
    assert multi.checkpoint.keep == 0 and one.out == str(tmp_path / "one-s3")


@pytest.mark.parametrize("override, says", [("benchmark.nope=1", "unknown \\[benchmark\\] key"),
                                            ("benchmark.seeds=[0, 0]", "each once"),
                                            ("benchmark.seeds=[0", "not TOML")])
def test_bad_benchmark_settings_are_one_line_errors(bench, override, says):
    with pytest.raises(SystemExit, match=says):
        bench.split(tomllib.loads(TOML), [override])


def test_one_trained_arm_is_refused(bench, tmp_path):
    cfg = tmp_path / "one.toml"
    cfg.write_text(TOML.replace('arms = ["mini-bash", "mini-claude-code", "mini-mimocode"]', 'arms = ["mini-bash"]'))
    with pytest.raises(SystemExit, match="two or more harness.arms"):
        bench.main(["--out", str(tmp_path / "o"), "--config", str(cfg)])


def _write(path: Path, passed: list[int], arm: str = "mini-codex"):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"source": "toolfind", "arm": arm, "task_id": f"t{i}", "reward": float(p), "passed": bool(p),
             "infra_failed": False} for i, p in enumerate(passed)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_tables_pair_each_seed_and_pool_the_seeds_by_hand(bench, tmp_path):
    data, b, run = bench.split(tomllib.loads(TOML), ["benchmark.seeds=[0, 1]"])
    runs = {("multi", 0): [1, 1, 0, 1], ("one", 0): [1, 0, 0, 0], ("multi", 1): [0, 0, 0, 0], ("one", 1): [0, 0, 0, 1]}
    for (kind, seed), final in runs.items():
        where = tmp_path / f"{kind}-s{seed}" / "heldout"
        _write(where / "sft" / "eval" / "eval.jsonl", [0, 0, 0, 0])
        _write(where / "final" / "eval" / "eval.jsonl", final)
    res = bench.results(tmp_path, b, data, run)
    s0 = res["multi_minus_one"][0]["final/heldout"]
    s1 = res["multi_minus_one"][1]["final/heldout"]
    # seed 0: differences 0, 1, 0, 1 -> +0.5, sd 0.577, SE 0.289; seed 1: 0, 0, 0, -1 -> -0.25, SE 0.25
    assert (s0["passed_change"], s0["passed_change_se"]) == pytest.approx((0.5, 0.2887), abs=1e-4)
    assert (s1["passed_change"], s1["passed_change_se"]) == pytest.approx((-0.25, 0.25))
    pooled = res["multi_minus_one_over_seeds"]["final/heldout"]
    # the mean of the seeds' differences, SE sqrt(0.2887^2 + 0.25^2) / 2 = 0.1909
    assert (pooled["passed_change"], pooled["passed_change_se"]) == pytest.approx((0.125, 0.1909), abs=1e-4)
    assert "final/mini-swe-agent" not in res["multi_minus_one_over_seeds"]  # not evaluated: not invented
    assert res["per_seed"][0]["multi"]["grpo_part"]["passed_change"] == pytest.approx(0.75)
    md = bench.table(res)
    assert "| mini-codex final | +0.500 ± 0.289 | -0.250 ± 0.250 | +0.125 ± 0.191 |" in md
    assert "| mini-swe-agent final | — | — | — |" in md


@pytest.mark.sandbox
@pytest.mark.slow  # two trainings and four evaluations, mini-swe-agent among them: `make test-slow`
def test_the_benchmark_trains_evaluates_and_resumes_without_rerunning_an_arm(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TOML)
    out = tmp_path / "bench"
    cmd = [sys.executable, str(PATH), "--out", str(out), "--config", str(cfg), "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    for kind, trained in (("multi", 3), ("one", 1)):
        row = res["per_seed"]["0"][kind]
        assert row["state"] == "done" and len(row["trained_arms"]) == trained
        # every attempt scored: an outside agent that cannot start is an infrastructure failure, not a score
        assert (row["sft/heldout"]["tasks"], row["sft/heldout"]["infra_failed"]) == (3, 0)
        assert (row["final/mini-swe-agent"]["tasks"], row["final/mini-swe-agent"]["infra_failed"]) == (2, 0)
    held = json.loads((out / "one-s0" / "heldout.json").read_text())
    assert held["final"]["checkpoint"].endswith("step-0001") and held["sft"]["checkpoint"].endswith("step-0000")
    assert set(held["final"]["per_arm"]) == {"mini-codex", "mini-swe-agent"}
    assert (out / "results.md").read_text().startswith("| seed |") and (out / "harness_transfer.png").is_file()
    stamp = (out / "multi-s0" / "heldout.json").stat().st_mtime
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count(": done (kept)") == 2
    assert (out / "multi-s0" / "heldout.json").stat().st_mtime == stamp
