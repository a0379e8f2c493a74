"""The reasoning domain through the real loop: single-turn arm, gateway, grader, filter, trainer."""

import asyncio
import json

import pytest

from rlonce import cli
from rlonce.config import load_config
from rlonce.core.records import Role, Status
from rlonce.engine.base import SamplingParams
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.domains import domain_for
from rlonce.harness.loop import HarnessLimits
from rlonce.model.chat import get_format
from rlonce.recipes.grpo import run
from rlonce.rollout.runner import RolloutSpec, run_sequence
from rlonce.telemetry.metrics import read_jsonl

REASONING = ["task.name=reasoning", "harness.arms=[single-turn]", "sft.demos=0",
             "task.options={chain_sum = {min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 2}}"]


def _spec(lm):
    return RolloutSpec(encode=lm.encode, decode=lm.decode, chat_format=get_format("hermes"),
                       sampling=SamplingParams(max_tokens=32), limits=HarnessLimits(), arms=("single-turn",))


@pytest.mark.parametrize("reply,reward,status", [
    ("Adding them: <answer>43</answer><|im_end|>", 1.1, Status.SUBMITTED),
    ("20 + 23 = 43<|im_end|>", 1.0, Status.SUBMITTED),
    ("<answer>44</answer><|im_end|>", 0.1, Status.SUBMITTED),
    ("twenty " * 40, 0.0, Status.LIMITS),  # cut by the 32-token budget: no answer
])
def test_single_turn_episode_is_graded_by_rule(lm, reply, reward, status):
    domain = domain_for(load_config(None, REASONING).task)
    task = domain.task("train", 7)
    assert task.question.endswith("20 + 23 =")
    engine = ScriptedEngine([reply], lm.encode)
    seq = asyncio.run(run_sequence(task, domain.env_factory, engine, _spec(lm), arm="single-turn"))
    assert seq.status is status and seq.reward == pytest.approx(reward)
    assert seq.turns == 1 and len(seq.contexts) == 1
    model = [g for g in seq.contexts[0].segments if g.role is Role.MODEL]
    assert len(model) == 1 and model[0].token_ids == lm.encode(reply)[:32]
    # the prompt is the system prompt and the question, no tools
    prompt = lm.decode(engine.prompts[0])
    assert "<answer></answer>" in prompt and task.question in prompt and "<tools>" not in prompt


def test_filter_writes_pass_rates_and_an_empty_pack_is_refused(tmp_path, capsys):
    out = tmp_path / "pack"
    assert cli.main(["tasks", "filter", "reasoning", "--model", "embedded", "--tasks", "4", "--k", "2",
                     "--out", str(out), "--quiet", *REASONING[3:], "harness.max_tokens_per_turn=16"]) == 0
    rows = read_jsonl(out / "filter.jsonl")
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and all(r["attempts"] == 2 for r in rows)
    report = json.loads((out / "filter.json").read_text())
    # the embedded model never learned arithmetic: every pass rate is 0, nothing is kept
    assert report["kept"] == [] and report["pass_rate_histogram"]["0.0"] == 4
    assert report["task_options"]["datasets"] == ["chain_sum"] and "pack" not in report["task_options"]
    assert "kept 0 of 4 tasks" in capsys.readouterr().out
    assert cli.main(["train", "--out", str(tmp_path / "run"), *REASONING, f"task.pack={out}"]) == 2
    assert "kept no task" in capsys.readouterr().err


def test_pack_keeps_only_its_tasks_and_must_match_the_config(tmp_path):
    pack = tmp_path / "p"
    pack.mkdir()
    drawn = {"datasets": ["chain_sum"],
             "options": {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}}
    (pack / "filter.json").write_text(json.dumps({"kept": [3, 8], "task_options": drawn, "max_pass": 0.9}))
    domain = domain_for(load_config(None, [*REASONING, f"task.pack={pack}"]).task)
    assert [domain.task("train", i).task_id for i in range(3)] == [
        "chain_sum/train/3", "chain_sum/train/8", "chain_sum/train/3"]
    assert domain.task("heldout", 0).task_id == "chain_sum/heldout/0"  # held-out is never filtered
    from rlonce.errors import PackError

    with pytest.raises(PackError, match="filtered from datasets"):
        domain_for(load_config(None, [*REASONING, f"task.pack={pack}", "task.datasets=[products]"]).task)


def test_a_reasoning_run_logs_the_train_inference_mismatch(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, [*REASONING, f"out={out}", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2",
                             "rl.minibatches=1", "algo.filter_no_contrast=false", "eval.heldout_tasks=4",
                             "eval.every=0", "harness.max_tokens_per_turn=16", "rl.optimizer=adamw-m1"])
    summary = run(cfg, progress=False)
    assert summary["task"] == "reasoning" and summary["heldout_tasks"] == 4
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # the engine (KV cache, left padding) and the trainer (one forward) agree to float32 rounding
        assert r["mismatch_tokens"] > 0 and 0 <= r["mismatch_kl"] < 1e-4 and r["mismatch_corr"] > 0.999
    for e in read_jsonl(out / "ledger.jsonl"):
        assert e["dispatched"] == 4 and e["retained"] == 4 and e["source"] == "reasoning"
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 9


def test_a_run_that_trains_nothing_says_so_each_step_and_fails_its_audit(tmp_path, capsys, caplog):
    """The embedded model never solves arithmetic: every group fails, is filtered for lack of
    contrast, and no token trains. Each step warns with why, the end says so, the audit fails."""
    out = tmp_path / "run"
    with caplog.at_level("WARNING", logger="rlonce.recipes.rl"):
        assert cli.main(["train", "--out", str(out), "--quiet", *REASONING, "rl.steps=2", "rl.tasks_per_step=2",
                         "rl.group_size=2", "eval.heldout_tasks=2", "eval.every=0",
                         "harness.max_tokens_per_turn=16"]) == 0
    ledger = read_jsonl(out / "ledger.jsonl")
    assert [e["step"] for e in ledger] == [1, 2] and all(e["retained"] == 0 for e in ledger)
    for e in ledger:  # every dispatched sequence was in a group that all failed
        assert e["no_contrast_filtered"] == e["dispatched"] > 0 and e["no_contrast_all_passed"] == 0
        assert f"step {e['step']} trained nothing: reasoning: {e['dispatched']} in groups that all failed " \
               "(sequences)" in caplog.text
    said = capsys.readouterr().out
    assert "WARNING: steps that trained nothing: 2/2 — this run did not train the model" in said
    n = sum(e["dispatched"] for e in ledger)
    assert f"WARNING: source reasoning trained no group in 2 steps: {n} of {n} sequences in groups that all failed" \
        in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_trained_nothing"] == 2 and summary["sources"]["reasoning"]["groups_retained"] == 0
    assert cli.main(["audit", str(out)]) == 1
    audit = capsys.readouterr().out
    assert f"[FAIL] trained          2 checked; 1 violation(s): the run trained on 0 tokens in 2 RL step(s): of {n} " \
           f"dispatched, {n} in groups that all failed (sequences)" in audit
