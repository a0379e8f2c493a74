"""A domain written outside the package (examples/filecount, the docs/domains.md example): loaded
by import string and by entry point, its grader probed, and trained beside toolfind by the CLI from
its own folder, with no edit to ``src/rlonce``."""

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlonce.config import ConfigError, load_config
from rlonce.config import domains as registry
from rlonce.envs.domains import domain_for
from rlonce.model.chat import ToolCall
from rlonce.rollout.hostile import FMT, _spec, arms_for, byte_encode, format_hostile, probe_hostile_input
from rlonce.rollout.runner import run_sequence

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "filecount"


@pytest.fixture
def in_example(monkeypatch):
    """The example's folder as the working directory, as a user runs it; the registry forgets what
    the test loaded."""
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.setattr(registry, "_LOADED", {})
    yield
    sys.modules.pop("filecount", None)


def _grade(domain, task, calls: list[ToolCall]) -> tuple[float, bool]:
    from rlonce.engine.scripted import ScriptedEngine

    turns = [FMT.assistant_text("", [c]) for c in calls]
    seq = asyncio.run(run_sequence(task, domain.env_factory, ScriptedEngine(turns, byte_encode), _spec(),
                                   arm="mini-bash"))
    assert seq.status.value != "infra", seq.cause
    return seq.reward, seq.passed


def test_the_example_loads_by_import_string_with_its_own_options(in_example):
    cfg = load_config(None, ["task.name=filecount:DOMAIN", "task.max_files=3"])
    assert cfg.task.source_label == "filecount" and cfg.task.max_files == 3
    domain = domain_for(cfg.task)
    tasks = [domain.task("train", i) for i in range(20)]
    assert all(1 <= len(t.files) <= 3 for t in tasks) and len({t.files for t in tasks}) > 1
    assert domain.task("heldout", 0) == domain.task("heldout", 0) != domain.task("train", 0)
    with pytest.raises(ConfigError, match=r"^unknown config key task.max_file for domain 'filecount:DOMAIN'; its keys: "
                                          r"max_files$"):
        load_config(None, ["task.name=filecount:DOMAIN", "task.max_file=3"])
    with pytest.raises(ConfigError, match=r"task.max_files' = 0 is out of range: use a finite value in \[1, 50\]"):
        load_config(None, ["task.name=filecount:DOMAIN", "task.max_files=0"])


def test_a_plugin_that_cannot_load_is_one_line_at_config_load(in_example, tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("raise RuntimeError('the plugin itself failed')\n")
    (tmp_path / "notaspec.py").write_text("DOMAIN = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, said in [("nosuchmodule:DOMAIN", "cannot import 'nosuchmodule' (ModuleNotFoundError"),
                       ("broken:DOMAIN", "cannot import 'broken' (RuntimeError: the plugin itself failed)"),
                       ("notaspec:DOMAIN", "notaspec:DOMAIN is a int, not a rlonce.config.domains.DomainSpec"),
                       ("filecount:NOPE", "'filecount' has no attribute 'NOPE'"),
                       ("filecount", "unknown domain 'filecount'; known: toolfind")]:
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"sources=[{{name = '{name}'}}]"])
        assert said in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_installed_package_registers_its_domain_by_entry_point(in_example, tmp_path, monkeypatch):
    dist = tmp_path / "filecount_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: filecount-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlonce.domains]\nfiles = filecount:DOMAIN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = registry.domain_names()
    assert names[:len(registry.BUILTIN)] == list(registry.BUILTIN) and "files" in names
    cfg = load_config(None, ["task.name=files"])
    assert cfg.task.source_label == "filecount" and domain_for(cfg.task).task("train", 0).source == "filecount"


def test_the_example_grader_pays_only_the_right_count_and_hostile_input_is_never_infrastructure(in_example):
    domain = domain_for(load_config(None, ["task.name=filecount:DOMAIN"]).task)
    task = domain.task("heldout", 3)
    n = str(len(task.files))
    look = ToolCall("bash", {"command": "ls box | wc -l"})
    assert _grade(domain, task, [look, ToolCall("submit", {"answer": n})]) == (1.0, True)
    # a control: the right count found another way and written with spaces around it
    control = [ToolCall("bash", {"command": "find box -type f | wc -l"}), ToolCall("submit", {"answer": f" {n}\n"})]
    assert _grade(domain, task, control) == (1.0, True)
    for route in ([ToolCall("submit", {"answer": str(len(task.files) + 1)})],  # a guess
                  [look, ToolCall("submit", {"answer": f"{n} or {int(n) + 1}"})],  # two answers
                  [look, ToolCall("bash", {"command": "touch box/extra.txt"}), ToolCall("submit", {"answer": n + "1"})],
                  [look, ToolCall("submit", {"answer": "the number printed above"})]):
        assert _grade(domain, task, route) == (0.0, False), route
    report = asyncio.run(probe_hostile_input(domain.env_factory, task, arms_for(False, True)))
    assert report["infra"] == 0 and report["passed"] == 0, format_hostile(report)


def test_the_example_trains_beside_toolfind_from_its_own_folder(tmp_path):
    """``rlonce train mixed.toml`` run from examples/filecount, as docs/domains.md says: both sources
    are dispatched every step, the plugin's code is in the run's provenance."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(Path(sys.executable).parent / "rlonce"), "train", "mixed.toml", "--out", str(out),
                        "--quiet", "rl.steps=2", "sft.demos=64", "sft.epochs=1", "eval.heldout_tasks=2"],
                       cwd=EXAMPLE, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["sources"]) == {"toolfind", "filecount"}
    assert summary["sources"]["filecount"]["domain"] == "filecount:DOMAIN"
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    per_step = {}
    for row in ledger:
        if row["dispatched"]:
            per_step.setdefault(row["step"], set()).add(row["source"])
    assert per_step == {1: {"toolfind", "filecount"}, 2: {"toolfind", "filecount"}}
    plugin = json.loads((out / "provenance.json").read_text())["plugins"]["filecount:DOMAIN"]
    assert plugin["path"] == str(EXAMPLE / "filecount.py")
    assert plugin["sha256"] == hashlib.sha256(b"filecount.py\0" + (EXAMPLE / "filecount.py").read_bytes()).hexdigest()


def test_a_changed_plugin_blocks_resuming_only_the_runs_that_use_it(tmp_path, monkeypatch):
    from rlonce.errors import UsageError
    from rlonce.recipes.provenance import FILE, check_resume, plugin_provenance

    (tmp_path / "mine.py").write_text((EXAMPLE / "filecount.py").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "_LOADED", {})
    run = tmp_path / "run"
    run.mkdir()
    try:
        (run / FILE).write_text(json.dumps({"plugins": plugin_provenance(["mine:DOMAIN"]), "resumes": []}))
        check_resume(run, {}, {}, 1, accept=False)  # unchanged: resumes
        (tmp_path / "mine.py").write_text((tmp_path / "mine.py").read_text() + "\n# changed\n")
        with pytest.raises(UsageError, match=r"domain plugin mine:DOMAIN \(.*mine.py: sha256 .* -> .*\) changed"):
            check_resume(run, {}, {}, 1, accept=False)
        assert check_resume(run, {}, {}, 1, accept=True)["resumes"][-1]["plugins_changed"] == ["mine:DOMAIN"]
        (run / FILE).write_text(json.dumps({"plugins": {}, "resumes": []}))  # a run that does not use it
        check_resume(run, {}, {}, 1, accept=False)
    finally:
        sys.modules.pop("mine", None)
