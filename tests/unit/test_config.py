import json

import pytest

from rlonce.config import ConfigError, RunConfig, load_config, read_saved_config, save_config


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(None, ["rl.steps=7", "harness.temperature=0.5", "model.name=/some/dir", "algo.objective.clip_c=2"])
    assert cfg.rl.steps == 7 and cfg.harness.temperature == 0.5 and cfg.model.name == "/some/dir"
    assert cfg.algo.objective.name == "ppo" and cfg.algo.objective.clip_c == 2.0


def test_objective_by_name_then_its_parameters():
    cfg = load_config(None, ["algo.objective=cispo", "algo.objective.eps_high=0.5", "algo.aggregation=prompt-mean"])
    assert (cfg.algo.objective.name, cfg.algo.objective.eps_high, cfg.algo.objective.eps_low) == ("cispo", 0.5, 1.0)
    assert cfg.algo.aggregation == "prompt-mean"
    cfg = load_config(None, ["algo.objective=four_bound", "algo.objective.entropy_band=[0.3, 0.8]"])
    assert cfg.algo.objective.entropy_band == (0.3, 0.8) and cfg.algo.objective.pos_high == 5.0
    with pytest.raises(ConfigError, match="unknown config key 'algo.objective.clip_low'; known keys here: name, eps_low"):
        load_config(None, ["algo.objective=cispo", "algo.objective.clip_low=0.1"])
    with pytest.raises(ConfigError, match="'ppo', 'four_bound', 'cispo', 'unified'"):
        load_config(None, ["algo.objective=grpo"])


def test_penalties_from_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[[algo.penalties]]\nrule = "tool_call"\nstrategy = "adv_signed"\nstrategy_params = {kappa = 3.0}\n'
                 '[algo.length]\nenabled = true\nmetrics = ["turns", "output_tokens"]\n')
    cfg = load_config(p)
    assert [(x.rule, x.strategy, x.strategy_params) for x in cfg.algo.penalties] == [("tool_call", "adv_signed",
                                                                                      {"kappa": 3.0})]
    assert cfg.algo.length.enabled and cfg.algo.length.metrics == ["turns", "output_tokens"]
    with pytest.raises(ConfigError, match="algo.penalties.rule"):
        load_config(None, ["algo.penalties=[{rule = 'nope'}]"])


def test_toml_file(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('out = "x"\n[rl]\nsteps = 3\ngroup_size = 4\n')
    cfg = load_config(p, ["rl.steps=5"])
    assert (cfg.out, cfg.rl.steps, cfg.rl.group_size) == ("x", 5, 4)


def test_unknown_key_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rl.stepz=3"])
    msg = str(e.value)
    assert "rl.stepz" in msg and "steps" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="unknown config key 'nope'"):
        load_config(None, ["nope=1"])


def test_malformed_toml_and_bad_values(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[rl\nsteps = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="rl.steps"):
        load_config(None, ["rl.steps=many"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_saved_config_round_trip(tmp_path):
    cfg = load_config(None, ["rl.steps=9"])
    save_config(cfg, tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["steps"] == 9
    assert read_saved_config(tmp_path / "config.json") == cfg
    assert read_saved_config(tmp_path / "config.json", ["rl.steps=10"]).rl.steps == 10


def test_shipped_configs_validate():
    from pathlib import Path

    for p in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml")):
        assert isinstance(load_config(p), RunConfig)


def test_config_module_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, rlonce.config, rlonce.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_harness_arms_override_takes_a_bare_list_and_rejects_unknown_arms():
    from rlonce.config import ConfigError, load_config

    cfg = load_config(None, ["harness.arms=[mini-bash, mini-codex]"])
    assert cfg.harness.arms == ["mini-bash", "mini-codex"]
    with pytest.raises(ConfigError, match="harness.arms"):
        load_config(None, ["harness.arms=[mini-vim]"])


def test_split_by_arm_makes_one_group_per_task_and_arm():
    from rlonce.core.records import Sample, Sequence
    from rlonce.rollout.runner import split_by_arm

    seqs = [Sequence("t", arm) for arm in ("a", "b", "a", "b", "b")]
    groups = split_by_arm([Sample("t", "toolfind", 3, seqs)])
    assert [(g.task_id, len(g.sequences)) for g in groups] == [("t/a", 2), ("t/b", 3)]
    assert all(g.dispatch_step == 3 for g in groups)


def test_reasoning_task_needs_the_single_turn_arm_and_no_sft():
    from rlonce.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r'set harness.arms = \["single-turn"\]'):
        load_config(None, ["task.name=reasoning", "sft.demos=0"])
    with pytest.raises(ConfigError, match="set sft.demos = 0"):
        load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]"])
    with pytest.raises(ConfigError, match="needs tools"):
        load_config(None, ["harness.arms=[single-turn]"])
    cfg = load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0",
                             "task.datasets=[chain_sum, products]"])
    assert cfg.task.datasets == ["chain_sum", "products"] and cfg.task.format_weight == 0.1


def test_named_optimizers():
    from rlonce.config import OPTIMIZERS, ConfigError, load_config

    assert OPTIMIZERS["adamw-m1"] == {"betas": (0.9, 0.95), "eps": 1e-15}
    assert load_config(None, []).rl.optimizer == "adamw-seeds"
    assert load_config(None, ["rl.optimizer=adamw-m1", "rl.adam_eps=1e-12"]).rl.adam_eps == 1e-12
    with pytest.raises(ConfigError, match="rl.optimizer"):
        load_config(None, ["rl.optimizer=sgd"])


def test_train_takes_the_config_file_as_a_positional_argument(tmp_path):
    from rlonce import cli

    p = tmp_path / "c.toml"
    p.write_text("[rl]\nsteps = 7\n")
    for argv in (["train", str(p), "rl.lr=0.001", "--out", str(tmp_path / "o")],
                 ["train", "--out", str(tmp_path / "o"), str(p), "rl.lr=0.001"],
                 ["train", "--config", str(p), "--out", str(tmp_path / "o"), "rl.lr=0.001"]):
        cfg, resume = cli.train_config(cli.parse_args(argv))
        assert (cfg.rl.steps, cfg.rl.lr, cfg.out, resume) == (7, 0.001, str(tmp_path / "o"), False)
    with pytest.raises(cli.UsageError, match="two configs"):
        cli.train_config(cli.parse_args(["train", "--config", str(p), str(p)]))
