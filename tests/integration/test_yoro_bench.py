"""``benchmarks/yoro_vs_specialists/run.py`` (issue 58): the arms' configs, the paired table by
hand, and the whole benchmark on the embedded model (about 20 s), run again without rerunning an arm."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).parents[2] / "benchmarks" / "yoro_vs_specialists" / "run.py"

TOML = """
[sft]
demos = 48
epochs = 1
detour_p = 0.0

[rl]
steps = 2
tasks_per_step = 3
group_size = 2

[eval]
every = 0

[[sources]]
name = "toolfind"
share = 2
heldout_tasks = 4
sft_demos = 32

[[sources]]
name = "reasoning"
label = "countbits"
arms = ["single-turn"]
datasets = ["count_bits"]
options = { count_bits = { min_n = 1, max_n = 15 } }
heldout_tasks = 4
max_context = 256
"""


@pytest.fixture(scope="module")
def bench(script_module):
    return script_module(PATH, "yoro_bench")


def test_each_specialist_gets_its_share_of_the_groups_and_no_sft_of_its_own(bench, tmp_path):
    import tomllib

    data = tomllib.loads(TOML)
    assert bench.arm_names(data) == ["mixed", "spec-toolfind", "spec-countbits"]
    # 3 groups a step by shares 2 : 1 -> 2 and 1; an override reaches the split
    assert bench.specialist_tasks(data, []) == {"toolfind": 2, "countbits": 1}
    assert bench.specialist_tasks(data, ["rl.tasks_per_step=9"]) == {"toolfind": 6, "countbits": 3}
    mixed = bench.arm_config("mixed", data, [], tmp_path)
    assert len(mixed.sources) == 2 and mixed.checkpoint.keep == 0 and mixed.out == str(tmp_path / "mixed")
    spec = bench.arm_config("spec-toolfind", data, [], tmp_path)
    assert [s.source_label for s in spec.sources] == ["toolfind"]
    assert spec.rl.tasks_per_step == 2 and spec.rl.steps == 2 and spec.rl.group_size == 2
    assert spec.sft.demos == 0 and spec.sources[0].sft_demos is None  # the mixed run's SFT model, no SFT again
    assert spec.model.name == str(tmp_path / "mixed" / "checkpoints" / "step-0000")


def _write_eval(path: Path, source: str, passed: list[int]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for i, p in enumerate(passed):
            f.write(json.dumps({"source": source, "arm": "a", "task_id": f"t{i}", "reward": float(p),
                                "passed": bool(p), "infra_failed": False}) + "\n")


def test_the_table_pairs_each_arm_on_the_same_tasks_by_hand(bench, tmp_path):
    import tomllib

    data = tomllib.loads(TOML)
    sft, mixed, spec = [1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0]
    _write_eval(tmp_path / "mixed" / "eval" / "baseline.jsonl", "toolfind", sft)
    _write_eval(tmp_path / "mixed" / "eval" / "final.jsonl", "toolfind", mixed)
    _write_eval(tmp_path / "spec-toolfind" / "eval" / "final.jsonl", "toolfind", spec)
    src = {"final_success": 0.75, "final_reward": 0.75, "heldout_tasks": 4, "sequences_retained": 8,
           "sequences_dispatched": 12, "heldout_change": {"passed_change": 0.5, "passed_change_se": 0.2887}}
    (tmp_path / "mixed" / "summary.json").write_text(json.dumps(
        {"sources": {"toolfind": src, "countbits": src}, "wall_seconds": 10.0}))
    (tmp_path / "spec-toolfind" / "summary.json").write_text(json.dumps(
        {"sources": {"toolfind": {**src, "final_success": 0.5, "baseline_success": 0.25}}, "wall_seconds": 4.0}))
    res = bench.results(tmp_path, data, [])
    row = res["sources"]["toolfind"]
    assert row["sft"]["success"] == 0.25 and row["sft"]["tasks"] == 4
    # specialist - SFT: differences 0, 1, 0, 0 -> mean 0.25, SE = sd / 2 = 0.5 / 2
    assert row["specialist_minus_sft"]["passed_change"] == pytest.approx(0.25)
    assert row["specialist_minus_sft"]["passed_change_se"] == pytest.approx(0.25)
    # mixed - specialist: differences 0, 0, 0, 1 -> the same numbers
    assert row["mixed_minus_specialist"]["passed_change"] == pytest.approx(0.25)
    assert row["specialist"]["own_baseline_success"] == 0.25
    assert res["arms"] == {"mixed": "done", "spec-toolfind": "done", "spec-countbits": "new"}
    assert res["specialists_wall_seconds"] == 4.0
    md = bench.table(res)
    assert "| toolfind | 4 | 0.250 | 0.750 | 0.500 | +0.500 ± 0.289 | +0.250 ± 0.250 | +0.250 ± 0.250 | 8 / 8 |" in md
    assert "| countbits | — |" in md  # nothing evaluated for it yet: said, not invented


def test_a_config_with_one_source_and_an_unknown_arm_are_refused(bench, tmp_path):
    cfg = tmp_path / "one.toml"
    cfg.write_text('[[sources]]\nname = "toolfind"\n')
    with pytest.raises(SystemExit, match="two or more"):
        bench.main(["--out", str(tmp_path / "o"), "--config", str(cfg)])
    cfg.write_text(TOML)
    with pytest.raises(SystemExit, match="unknown arm.*spec-nope.*mixed, spec-toolfind, spec-countbits"):
        bench.main(["--out", str(tmp_path / "o2"), "--config", str(cfg), "--arms", "spec-nope"])


def test_the_benchmark_runs_every_arm_and_resumes_without_rerunning_one(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TOML)
    out = tmp_path / "bench"
    cmd = [sys.executable, str(PATH), "--out", str(out), "--config", str(cfg), "--quiet"]
    # a specialist before the mixed run has no SFT model to start from: said, skipped
    r = subprocess.run([*cmd, "--arms", "spec-countbits"], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0 and "waits for the mixed run's SFT checkpoint" in r.stdout
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["arms"] == {"mixed": "done", "spec-toolfind": "done", "spec-countbits": "done"}
    for label in ("toolfind", "countbits"):
        row = res["sources"][label]
        assert row["sft"]["tasks"] == 4 and {"mixed", "specialist", "mixed_minus_specialist"} <= row.keys()
        # the specialist's own baseline is the same SFT model on the same seeded attempts
        assert row["specialist"]["own_baseline_success"] == pytest.approx(row["sft"]["success"])
    mixed = json.loads((out / "mixed" / "summary.json").read_text())
    spec = json.loads((out / "spec-toolfind" / "summary.json").read_text())
    assert mixed["rl_steps"] == spec["rl_steps"] == 2
    assert (out / "results.md").read_text().startswith("| source |") and (out / "yoro_vs_specialists.png").is_file()
    stamp = (out / "mixed" / "summary.json").stat().st_mtime
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.count(": done (kept)") == 3
    assert (out / "mixed" / "summary.json").stat().st_mtime == stamp
    cfg.write_text(TOML.replace("steps = 2", "steps = 3"))  # another config for the same run directory
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "was started with another config" in r.stderr
