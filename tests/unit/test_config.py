import json
import re
from typing import get_origin

import pytest

from rlonce.config import ConfigError, RunConfig, load_config, read_saved_config, save_config


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(None, ["rl.steps=7", "harness.temperature=0.5", "model.name=/some/dir",
                             "algo.objective.clip_c=2"])
    assert cfg.rl.steps == 7 and cfg.harness.temperature == 0.5 and cfg.model.name == "/some/dir"
    assert cfg.algo.objective.name == "ppo" and cfg.algo.objective.clip_c == 2.0


def test_objective_by_name_then_its_parameters():
    cfg = load_config(None, ["algo.objective=cispo", "algo.objective.eps_high=0.5", "algo.aggregation=prompt-mean"])
    assert (cfg.algo.objective.name, cfg.algo.objective.eps_high, cfg.algo.objective.eps_low) == ("cispo", 0.5, 1.0)
    assert cfg.algo.aggregation == "prompt-mean"
    cfg = load_config(None, ["algo.objective=four_bound", "algo.objective.entropy_band=[0.3, 0.8]"])
    assert cfg.algo.objective.entropy_band == (0.3, 0.8) and cfg.algo.objective.pos_high == 5.0
    with pytest.raises(ConfigError,
                       match="unknown config key 'algo.objective.clip_low'; known keys here: name, eps_low"):
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


def test_each_source_gets_the_arms_its_domain_needs_and_sft_only_with_an_expert(monkeypatch):
    import dataclasses

    from rlonce.config import ConfigError, domains, load_config
    from rlonce.rollout.sources import check_sources

    with pytest.raises(ConfigError, match=r'set harness.arms = \["single-turn"\]'):
        check_sources(load_config(None, ["task.name=reasoning", "sft.demos=0"]))
    with pytest.raises(ConfigError, match="needs tools"):
        check_sources(load_config(None, ["harness.arms=[single-turn]"]))
    # reasoning has a scripted expert now: SFT is allowed
    check_sources(load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]"]))
    no_expert = dataclasses.replace(domains.load_domain("reasoning"), has_expert=False)
    monkeypatch.setitem(domains._LOADED, "reasoning", no_expert)
    with pytest.raises(ConfigError, match="set sft.demos = 0"):
        check_sources(load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]"]))
    cfg = load_config(None, ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0",
                             "task.datasets=[chain_sum, products]"])
    assert cfg.task.datasets == ["chain_sum", "products"] and cfg.task.format_weight == 0.1


def test_named_optimizers():
    from rlonce.config import OPTIMIZERS, ConfigError, load_config

    assert OPTIMIZERS["adamw-m1"] == {"betas": (0.9, 0.95), "eps": 1e-15}  # M1: ε = 1e-15
    assert OPTIMIZERS["adamw-mimo"] == {"betas": (0.95, 0.95), "eps": 1e-8}  # seed 001: β₁ = β₂ = 0.95, ε = 1e-8
    assert OPTIMIZERS["adamw-gpt3"] == {"betas": (0.9, 0.95), "eps": 1e-8}
    assert load_config(None, []).rl.optimizer == "adamw-gpt3"
    with pytest.raises(ConfigError, match="'adamw-seeds' was renamed 'adamw-gpt3'"):
        load_config(None, ["rl.optimizer=adamw-seeds"])
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


def _numeric_fields():
    """(key, FieldInfo) of every int/float config field, objective variants included."""
    from rlonce.config import _VARIANTS, AlgoConfig, PenaltyConfig, RunConfig, _numeric, _section_type

    out = []

    def walk(section, prefix):
        for name, info in section.model_fields.items():
            sub = _section_type(info.annotation)
            if section is AlgoConfig and name == "objective":
                for v in _VARIANTS.values():
                    walk(v, f"{prefix}objective.{v.model_fields['name'].default}.")
            elif sub is not None and get_origin(info.annotation) is list:
                continue  # a list of tables has no dotted keys (its numbers: test_sources_config)
            elif sub is not None:
                walk(sub, f"{prefix}{name}.")
            elif _numeric(info.annotation) and "dict" not in str(info.annotation):
                out.append((f"{prefix}{name}", info))

    walk(RunConfig, "")
    from rlonce.config.domains import BUILTIN, load_domain

    for name in BUILTIN:  # a domain's options are [task] keys once task.name names it
        walk(load_domain(name).options, f"task.{name}:")
    assert PenaltyConfig not in [type(i) for _, i in out]
    return out


def test_every_numeric_field_states_bounds_and_a_description():
    from rlonce.config import bounds

    fields = _numeric_fields()
    assert len(fields) == 134  # heldout_fraction twice: code and cyber
    unbounded = [k for k, info in fields if not bounds(info) and "entropy_band" not in k]
    assert unbounded == []
    undocumented = [k for k, info in fields if not info.description]
    assert undocumented == []


def test_nan_inf_and_booleans_are_refused_for_every_number():
    from rlonce.config import _VARIANTS

    for key, _ in _numeric_fields():
        parts = key.split(".")
        pre = []
        if parts[1:2] == ["objective"]:
            pre, key = [f"algo.objective={parts[2]}"], ".".join(parts[:2] + parts[3:])
        if ":" in parts[1]:  # task.DOMAIN:KEY
            domain, parts[1] = parts[1].split(":")
            pre, key = [f"task.name={domain}"], ".".join(parts)
        for bad in ("nan", "inf", "-inf", "true"):
            with pytest.raises(ConfigError, match=f"config key '{key}' = "):
                load_config(None, [*pre, f"{key}={bad}"])
    assert set(_VARIANTS) == {"ppo", "four_bound", "cispo", "unified", "gspo"}


def test_bounds_text_and_error_line_are_exact():
    from rlonce.config import RLConfig, bounds

    assert [bounds(RLConfig.model_fields[k]) for k in ("lr", "group_size", "steps", "adam_eps")] == \
        ["(0, 1]", "[2, 1024]", "[0, 1000000]", "(0, 1]"]
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rl.group_size=1"])
    assert str(e.value) == "config key 'rl.group_size' = 1 is out of range: use a finite value in [2, 1024]"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rl.steps=true"])
    assert str(e.value) == ("config key 'rl.steps' = 'true': Input should be a valid integer, unable to parse string "
                            "as an integer (bounds: [0, 1000000])")
    cfg = load_config(None, ["rl.group_size=2", "rl.lr=1", "harness.top_p=1", "eval.every=0", "checkpoint.keep=0"])
    assert (cfg.rl.group_size, cfg.rl.lr, cfg.harness.top_p, cfg.eval.every, cfg.checkpoint.keep) == (2, 1.0, 1.0, 0, 0)


def test_cross_field_rules():
    with pytest.raises(ConfigError,
                       match=r"^harness.max_tokens_per_turn \(2000\) exceeds harness.max_context \(1024\)"):
        load_config(None, ["harness.max_tokens_per_turn=2000"])
    assert load_config(None, ["harness.max_tokens_per_turn=2000",
                              "harness.max_context=2000"]).harness.max_context == 2000
    with pytest.raises(ConfigError, match=r"^algo.length.deadzone \(1.0\) must be below algo.length.saturation"):
        load_config(None, ["algo.length.deadzone=1"])
    with pytest.raises(ConfigError, match=r"the band \[0.8, 0.3\] is empty"):
        load_config(None, ["algo.objective=four_bound", "algo.objective.entropy_band=[0.8, 0.3]"])
    with pytest.raises(ConfigError,
                       match="penalty strategy 'adv_signed' has no parameter 'kapa'; its parameters: kappa"):
        load_config(None, ["algo.penalties=[{rule = 'tool_call', strategy = 'adv_signed', "
                           "strategy_params = {kapa = 3.0}}]"])


def test_penalty_parameter_names_match_the_functions():
    import inspect

    from rlonce.algo import penalties
    from rlonce.config import PENALTY_PARAMS

    funcs = {**penalties.RULES, **penalties.ROW_STRATEGIES, **penalties.BATCH_STRATEGIES}
    assert set(funcs) == set(PENALTY_PARAMS)
    for name, fn in funcs.items():
        kw = [p.name for p in inspect.signature(fn).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name != "weights"]
        assert tuple(kw) == PENALTY_PARAMS[name], name


def test_saved_config_that_is_not_an_object_or_not_utf8(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a usable saved config: not a JSON object"):
        read_saved_config(p)
    t = tmp_path / "c.toml"
    t.write_bytes(b"[rl]\nsteps = 3 # \xff\n")
    with pytest.raises(ConfigError, match=f"config file {t} is not UTF-8 text"):
        load_config(t)
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory"):
        load_config(tmp_path)


def test_docs_config_md_lists_every_key_as_the_schema_does():
    from pathlib import Path

    from rlonce.config import reference

    doc = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    assert reference() in doc, "docs/config.md is stale: regenerate its table with rlonce.config.reference()"


def test_rollout_kv_budget_is_unset_by_default_and_bounded():
    assert load_config(None, []).rollout.kv_budget is None
    assert load_config(None, ["rollout.kv_budget=65536"]).rollout.kv_budget == 65536
    with pytest.raises(ConfigError, match=r"rollout.kv_budget.* in \[1, "):
        load_config(None, ["rollout.kv_budget=0"])


def test_a_domain_module_imports_first_in_a_fresh_interpreter():
    """Importing a domain before ``rlonce.config`` once failed: the run config's default ``[task]``
    was validated while the domain package was half imported ('has no attribute DOMAIN')."""
    import subprocess
    import sys

    from rlonce.config.domains import BUILTIN

    for name in BUILTIN:
        r = subprocess.run([sys.executable, "-c", f"import rlonce.envs.{name}.env"], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stderr[-400:]}"


def test_an_override_reaches_one_source_by_index_or_label():
    cfg = load_config("configs/yoro7.toml", ["sources.code.sft_demos=0", "sources.1.share=3",
                                              "sources.arith.temperature=0.5"])
    by = {s.label or s.name: s for s in cfg.sources}
    assert (by["code"].sft_demos, by["arith"].share, by["arith"].temperature) == (0, 3.0, 0.5)
    assert by["toolfind"].share == 2.0 and by["cyber"].temperature == 0.7  # the others as the file says
    for bad, says in ((["sources.nope.share=2"], "no single table 'nope' among 8 (toolfind, arith, code"),
                      (["sources.9.share=2"], "no single table '9'"),
                      (["sources.share=2"], "'sources' is a list of tables; name one of them, e.g. sources.0.share")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config("configs/yoro7.toml", bad)
