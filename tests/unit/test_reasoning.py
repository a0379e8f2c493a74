"""Reasoning domain: task streams, answer extraction, the rule-based reward, the difficulty filter."""

import math

import pytest
import torch

from rlonce.envs.reasoning import verify
from rlonce.envs.reasoning.tasks import TaskSpecError, make_task
from rlonce.recipes.filter import pass_rates
from rlonce.train.trainer import mismatch_metrics

OPTS = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}


def test_task_streams_are_reproducible_and_splits_differ():
    a, b = make_task("train", 5, ["chain_sum"], OPTS), make_task("train", 5, ["chain_sum"], OPTS)
    assert a == b and a.task_id == "chain_sum/train/5"
    held = [make_task("heldout", i, ["chain_sum"], OPTS).question for i in range(20)]
    train = [make_task("train", i, ["chain_sum"], OPTS).question for i in range(20)]
    assert held != train
    # the gold answer is the expression's value
    expr = a.entry["metadata"]["expression"]
    assert int(a.answer) == eval(expr)  # noqa: S307 - a generated "58 + 26"


def test_datasets_take_turns():
    names = [make_task("train", i, ["chain_sum", "products"]).dataset for i in range(4)]
    assert names == ["chain_sum", "products", "chain_sum", "products"]


def test_unknown_dataset_is_one_clear_error():
    with pytest.raises(TaskSpecError, match="unknown reasoning-gym dataset 'chain_sums'"):
        make_task("train", 0, ["chain_sums"])


@pytest.mark.parametrize("reply,answer,tagged", [
    ("I think <answer> 42 </answer>", "42", True),
    ("<answer>1</answer> no wait <answer>2</answer>", "2", True),
    ("58 + 26 = 84.", "84", False),
    ("The sum is 1,234", "1234", False),
    ("yes\nFalse\n", "False", False),
    ("", None, False),
])
def test_extract(reply, answer, tagged):
    assert verify.extract(reply) == (answer, tagged)


def test_reward_is_correctness_plus_format():
    t = make_task("train", 7, ["chain_sum"], OPTS)
    assert t.question.endswith("20 + 23 =") and t.answer == "43"
    assert verify.reward(t, "<answer>43</answer>", 0.1) == (pytest.approx(1.1), {"correct": 1.0, "format_ok": 1.0})
    assert verify.reward(t, "20 + 23 = 43", 0.1) == (1.0, {"correct": 1.0, "format_ok": 0.0})
    assert verify.reward(t, "<answer>44</answer>", 0.1) == (pytest.approx(0.1), {"correct": 0.0, "format_ok": 1.0})
    assert verify.reward(t, "no idea", 0.1) == (0.0, {"correct": 0.0, "format_ok": 0.0})
    # math-verify: an equivalent form the generator's string scorer rejects
    assert verify.correctness(t, "43.0") == 1.0 and verify.correctness(t, "86/2") == 1.0


def test_the_grader_says_passed_and_the_format_bonus_is_not_a_pass():
    import asyncio

    from rlonce.core.records import Grade, Sequence
    from rlonce.envs.reasoning.env import ReasoningEnv

    t = make_task("train", 7, ["chain_sum"], OPTS)
    grades = [asyncio.run(ReasoningEnv(t).grade(Sequence(t.task_id, "single-turn", answer=reply)))
              for reply in ("<answer>43</answer>", "20 + 23 = 43", "<answer>44</answer>", "no idea")]
    assert all(isinstance(g, Grade) for g in grades)
    assert [g.reward for g in grades] == pytest.approx([1.1, 1.0, 0.1, 0.0])
    assert [g.passed for g in grades] == [True, True, False, False]


def test_math_equal():
    assert verify.math_equal("0.5", "\\frac{1}{2}")
    assert verify.math_equal("12", "\\boxed{12}")
    assert not verify.math_equal("12", "13")


def test_pass_rates_keep_strictly_between_zero_and_max():
    # per task: (successes, scored attempts)
    rates, kept = pass_rates([(0, 8), (1, 8), (7, 8), (8, 8), (0, 0), (3, 4)], max_pass=0.9)
    assert rates == [0.0, 0.125, 0.875, 1.0, None, 0.75]
    assert kept == [1, 2, 5]
    assert pass_rates([(9, 10)], max_pass=0.9)[1] == []  # 0.9 itself is not kept


def test_mismatch_metrics_by_hand():
    mu = torch.tensor([0.5, 0.25, 0.8]).log()
    pi = torch.tensor([0.5, 0.5, 0.4]).log()
    m = mismatch_metrics(mu, pi)
    d = [0.0, math.log(2), math.log(0.5)]
    assert m["mismatch_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 3)  # = 0.0327...
    assert m["mismatch_k1"] == pytest.approx(-sum(d) / 3)  # = 0
    assert m["mismatch_max_abs"] == pytest.approx(math.log(2))
    # Pearson correlation of (0.5, 0.25, 0.8) and (0.5, 0.5, 0.4), by hand: -0.02833 / 0.03180 = -0.8910
    p, q = [0.5, 0.25, 0.8], [0.5, 0.5, 0.4]
    mp, mq = sum(p) / 3, sum(q) / 3
    cov = sum((a - mp) * (b - mq) for a, b in zip(p, q))
    corr = cov / math.sqrt(sum((a - mp) ** 2 for a in p) * sum((b - mq) ** 2 for b in q))
    assert m["mismatch_corr"] == pytest.approx(corr, abs=1e-6) and corr == pytest.approx(-0.8910, abs=1e-4)
    same = mismatch_metrics(mu, mu.clone())
    assert same["mismatch_kl"] == 0 and same["mismatch_corr"] == pytest.approx(1.0) and same["mismatch_tokens"] == 3
