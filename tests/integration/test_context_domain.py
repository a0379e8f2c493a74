"""The context domain through the real loop: the single-turn arm, the gateway's parse, the grader,
and a short SFT + GRPO run on the embedded model."""

import asyncio
import json
import random

from rlonce.config import load_config
from rlonce.core.records import Status
from rlonce.engine.scripted import ScriptedEngine
from rlonce.envs.context.expert import write
from rlonce.envs.context.probe import ROUTES, unusual
from rlonce.envs.domains import domain_for
from rlonce.recipes.grpo import run
from rlonce.rollout.hostile import FMT, _spec, byte_encode
from rlonce.rollout.runner import run_sequence
from rlonce.telemetry.metrics import read_jsonl

CONTEXT = ["task.name=context", "harness.arms=[single-turn]"]


def _reply(domain, task, text: str):
    engine = ScriptedEngine([FMT.assistant_text(text, [])], byte_encode)
    seq = asyncio.run(run_sequence(task, domain.env_factory, engine, _spec(), arm="single-turn"))
    assert seq.status is Status.SUBMITTED, seq.cause
    return seq


def test_replies_are_graded_by_their_items_through_the_single_turn_arm():
    domain = domain_for(load_config(None, CONTEXT).task)
    for i in range(8):  # two tasks of each family
        task = domain.task("heldout", i)
        right = _reply(domain, task, write(task, task.answer))
        assert (right.reward, right.passed) == (1.0, True) and right.answer == write(task, task.answer)
        assert right.metrics["items_passed"] == right.metrics["items"] == len(task.items)
        assert _reply(domain, task, unusual(task)).passed
        for name in ("distractor", "refuse", "copy_context"):
            wrong = _reply(domain, task, ROUTES[name](task))
            assert (wrong.reward, wrong.passed) == (0.0, False), (name, wrong.transcript)
        # the expert's demonstration is the reference reply
        assert domain.expert(task, random.Random(0), FMT) == [FMT.assistant_text(write(task, task.answer), [])]


def test_a_context_run_trains_from_the_expert_then_grpo(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(None, [*CONTEXT, f"out={out}", "sft.demos=8", "sft.epochs=1", "sft.batch_rows=8",
                             "sft.warmup_steps=1", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2",
                             "rl.minibatches=1", "algo.filter_no_contrast=false", "eval.heldout_tasks=4",
                             "eval.every=0", "harness.max_tokens_per_turn=32"])
    summary = run(cfg, progress=False)
    assert summary["task"] == "context" and summary["heldout_tasks"] == 4
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    ledger = read_jsonl(out / "ledger.jsonl")
    assert all(e["source"] == "context" and e["dispatched"] == 4 and e["retained"] == 4 for e in ledger)
    assert sum(e["infra_failed"] for e in ledger if "infra_failed" in e) == 0
    baseline = [json.loads(line) for line in (out / "eval" / "baseline.jsonl").read_text().splitlines()]
    assert len(baseline) == 4 and {r["source"] for r in baseline} == {"context"}
