"""Attacks on the grading layer: hostile judge replies and hostile attempts in a grader's workspace.

- A judge endpoint (or a model steered by the policy's text) answering with JSON nested past the
  parser's depth, or with megabytes of text, gives no verdict (counted), never an exception that
  would fail the group as infrastructure.
- An attempt's change is text the policy wrote: in an agentic grader's workspace it is a file's
  content, never run or expanded on the host, and its sandbox is gone afterwards.
- The judge's key is read from the environment and reaches neither the call record nor the run's
  saved config.
"""

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlonce.grading.agentic import AgenticJudge
from rlonce.grading.judge import ScriptedJudge
from rlonce.grading.scripted import scripted_rules
from rlonce.grading.verdicts import GroupQuality, HackVerdict, gar_prompt


@pytest.mark.parametrize("reply", ["{" * 200_000, '{"hack": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                   "x" * 5_000_000 + '{"hack": "maybe"}'])
def test_hostile_judge_replies_give_no_verdict_and_no_exception(reply, tmp_path):
    judge = ScriptedJudge(lambda k, p, s: reply, retries=0, record=tmp_path / "calls.jsonl")
    v = asyncio.run(judge.ask("is it a hack?", HackVerdict, kind="hack"))
    assert not v.ok and v.outcome in ("non_json", "invalid")
    line = json.loads((tmp_path / "calls.jsonl").read_text())
    assert len(line["reply"]) <= 20_000  # the record keeps a bounded cut of what came back


@pytest.mark.sandbox
def test_an_attempts_text_is_a_file_in_the_graders_sandbox_never_run_on_the_host(tmp_path):
    marker = tmp_path / "pwned"
    hostile = (f"+ $(touch {marker})\n+ `touch {marker}`\n+ ; touch {marker}\n"
               "+ ../../../../etc/passwd\n")
    files = {"TASK.md": "fix it", "attempts/0.diff": hostile, "attempts/1.diff": "+ return a + b\n"}
    judge = AgenticJudge(ScriptedJudge(scripted_rules, retries=0))
    prompt = gar_prompt("fix it", [(0, "passed", hostile), (1, "passed", "+ return a + b\n")])
    before = set(Path("/tmp").glob("rlonce-sbx-*"))
    v = asyncio.run(judge.ask(prompt, GroupQuality, kind="gar", task=SimpleNamespace(task_id="t"), files=files))
    assert v.ok and {a.attempt for a in v.value.attempts} == {0, 1}
    assert not marker.exists()  # printed by cat inside the sandbox, expanded nowhere
    assert set(Path("/tmp").glob("rlonce-sbx-*")) <= before  # the grader's sandbox is removed


def test_the_judge_key_reaches_neither_the_record_nor_the_saved_config(tmp_path, monkeypatch):
    from rlonce.config import load_config, save_config
    from rlonce.grading.build import build_judge

    monkeypatch.setenv("MY_JUDGE_KEY", "sk-live-abcdef")
    cfg = load_config(None, ["grading.judge.kind=endpoint", "grading.judge.api_key_env=MY_JUDGE_KEY",
                             "grading.judge.base_url=http://127.0.0.1:9/v1", "grading.judge.retries=0"])
    judge = build_judge(cfg.grading.judge, tmp_path / "calls.jsonl")
    v = asyncio.run(judge.ask("q", HackVerdict, kind="hack"))
    assert v.outcome == "down"
    save_config(cfg, tmp_path / "config.json")
    for f in tmp_path.iterdir():
        assert "sk-live-abcdef" not in f.read_text(), f.name
    assert "MY_JUDGE_KEY" in (tmp_path / "config.json").read_text()  # the variable's name, not its value
