"""The config is its own documentation: every field has a docstring, every name list in the schema
equals the registry it copies, and ``rlonce config show`` prints the resolved value, docstring and
default of each key."""

import argparse
import inspect
import subprocess
import sys
from pathlib import Path
from typing import get_args

from pydantic import BaseModel

from rlonce import config as C

ROOT = Path(__file__).resolve().parents[2]


def _literal(model: type[BaseModel], field: str) -> set[str]:
    """The values of ``model.field``'s Literal (of its items, for a list of a Literal)."""
    annotation = model.model_fields[field].annotation
    while get_args(annotation) and not isinstance(get_args(annotation)[0], str):
        annotation = get_args(annotation)[0]
    return set(get_args(annotation))


def _variants() -> list[type[BaseModel]]:
    union = get_args(C.Objective)[0]
    return list(get_args(union))


def test_algo_literals_equal_their_registries():
    from rlonce.algo.correction import CORRECTIONS
    from rlonce.algo.losses import AGGREGATIONS, OBJECTIVES
    from rlonce.algo.penalties import RULES, STRATEGIES
    from rlonce.algo.shaping import COMBINES
    from rlonce.algo.signal import CONTEXT_EXPORTS, LENGTH_METRICS

    assert _literal(C.AlgoConfig, "aggregation") == set(AGGREGATIONS)
    assert {v.model_fields["name"].default for v in _variants()} == set(OBJECTIVES)
    assert _literal(C.AlgoConfig, "rollout_correction") == {"none", *CORRECTIONS}
    assert _literal(C.PenaltyConfig, "rule") == set(RULES)
    assert _literal(C.PenaltyConfig, "strategy") == set(STRATEGIES)
    assert _literal(C.LengthConfig, "metrics") == set(LENGTH_METRICS)
    assert _literal(C.LengthConfig, "combine") == set(COMBINES)
    assert _literal(C.AlgoConfig, "export_contexts") == set(CONTEXT_EXPORTS)


def test_each_objective_variant_has_exactly_its_loss_functions_parameters():
    from rlonce.algo.losses import OBJECTIVES

    for variant in _variants():
        name = variant.model_fields["name"].default
        kw = [p.name for p in inspect.signature(OBJECTIVES[name]).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert list(C.objective_params(C.AlgoConfig(objective=name))) == kw, name
        loss_defaults = [p.name for p in inspect.signature(OBJECTIVES[name]).parameters.values()
                         if p.default is not p.empty]
        assert loss_defaults == [], f"{name}: the config owns these defaults"


def test_other_literals_equal_their_registries():
    from rlonce.envs.domains import domain_for
    from rlonce.harness.arms import ARMS

    assert set(get_args(C.ArmName)) == set(ARMS)
    assert _literal(C.RLConfig, "optimizer") == set(C.OPTIMIZERS)
    from rlonce.config.domains import BUILTIN
    from rlonce.errors import PackError

    for name in BUILTIN:  # domains are built by name
        if name in ("code", "cyber"):  # need a validated pack (test_code_training.py, test_cyber_domain.py)
            try:
                domain_for(C.TaskConfig(name=name))
            except PackError as e:
                assert f"rlonce tasks build {name} --out DIR" in str(e) and "\n" not in str(e)
            else:
                raise AssertionError(f"task {name!r} without task.pack should say how to make a pack")
            continue
        assert domain_for(C.TaskConfig(name=name)).name == name


def test_cli_choices_equal_the_config_literals():
    from rlonce import cli

    verbs = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for verb in ("quickstart", "train"):
        choices = {a.dest: set(a.choices) for a in verbs[verb]._actions if a.choices}
        assert choices["mode"] == _literal(C.RolloutConfig, "mode"), verb
        assert choices["executor"] == _literal(C.RunConfig, "executor"), verb


def _models() -> list[type[BaseModel]]:
    """Every pydantic model reachable from ``RunConfig`` (through unions and lists too)."""
    found: list[type[BaseModel]] = []

    def inner(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for a in get_args(annotation):
            yield from inner(a)

    def visit(model):
        if model in found:
            return
        found.append(model)
        for info in model.model_fields.values():
            for sub in inner(info.annotation):
                visit(sub)

    visit(C.RunConfig)
    return found


def test_every_config_field_has_a_docstring():
    models = _models()
    assert {C.PenaltyConfig, C.LengthConfig, C.RayConfig, *_variants()} <= set(models)
    undocumented = [f"{m.__name__}.{name}" for m in models for name, info in m.model_fields.items()
                    if not (info.description or "").strip()]
    assert undocumented == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlonce.cli", "config", "show", *args], capture_output=True,
                          text=True, cwd=ROOT, check=False)


def test_config_show_one_key_with_overrides_and_a_config_file(tmp_path):
    r = _cli("rl.lr")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "rl.lr = 0.0002\n    Learning rate of the RL AdamW. (the default; bounds (0, 1])\n"
    toml = tmp_path / "c.toml"
    toml.write_text("[rl]\nsteps = 7\nlr = 0.001\n")
    r = _cli(str(toml), "rl", "rl.lr=0.01")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "rl.steps = 7" and "(default 40; bounds [0, 1000000])" in lines[1]
    assert "rl.lr = 0.01" in lines and all(line.startswith(("rl.", "    ")) for line in lines)
    r = _cli("--config", str(toml), "algo.objective", "algo.objective=cispo", "algo.objective.eps_high=0.5")
    assert r.stdout.splitlines()[::2] == ['algo.objective = "cispo"', "algo.objective.eps_low = 1.0",
                                          "algo.objective.eps_high = 0.5"]


def test_config_show_unknown_key_is_one_line_and_exit_2():
    r = _cli("rl.lrr")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("rlonce: error: config show: unknown config key 'rl.lrr'; known keys in rl: steps,")
    assert r.stderr.count("\n") == 1


def test_config_show_lists_every_key_and_each_is_in_docs_config_md(capsys):
    from rlonce import cli

    assert cli.main(["config", "show", "rollout.mode=async"]) == 0
    out = capsys.readouterr().out.splitlines()
    keys = [line.split(" = ")[0] for line in out[::2]]
    assert keys == [s.key for s in C.settings(C.load_config(None, []))]
    assert 'rollout.mode = "async"' in out
    assert all(line.startswith("    ") and line.endswith(")") for line in out[1::2])
    doc = (ROOT / "docs" / "config.md").read_text()
    assert [k for k in keys if f"| `{k}` |" not in doc] == []
    assert "rlonce config show" in doc


def test_config_show_of_a_run_directory(tmp_path, capsys):
    from rlonce import cli

    C.save_config(C.load_config(None, ["rl.steps=5"]), tmp_path / "config.json")
    assert cli.main(["config", "show", "--resume", str(tmp_path), "rl.steps", "rl.lr=0.01"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "rl.steps = 5"
    assert cli.main(["config", "show", "rl.lr", "rl.steps"]) == 2
    assert capsys.readouterr().err == "rlonce: error: config show: one KEY at most, got rl.lr rl.steps\n"

