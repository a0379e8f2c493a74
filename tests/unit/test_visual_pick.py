"""The visual group pick: Williams orders, pick scores, the query-fit deduction and the row reward
by hand, and whole groups graded by a scripted judge that reads the screenshots it is shown."""

import asyncio
import itertools
import json
import random

import pytest

from rlonce.envs.visual import pick as vp
from rlonce.envs.visual.pick import GroupResult, PickVerdict, grade_group, pick_orders, pick_scores, row_reward
from rlonce.grading.judge import ScriptedJudge


def test_williams_orders_for_eight_by_hand_and_balanced():
    rows = vp.williams_orders(8)
    assert rows[0] == [0, 1, 7, 2, 6, 3, 5, 4]
    assert rows[1] == [1, 2, 0, 3, 7, 4, 6, 5]
    assert len(rows) == 8
    for pos in range(8):  # every candidate once in each position
        assert sorted(r[pos] for r in rows) == list(range(8))
    pairs = [(r[k], r[k + 1]) for r in rows for k in range(7)]  # every ordered neighbour pair once
    assert sorted(pairs) == sorted(itertools.permutations(range(8), 2))
    assert vp.williams_orders(2) == [[0, 1], [1, 0]]
    assert vp.williams_orders(4)[0] == [0, 1, 3, 2]
    with pytest.raises(ValueError):
        vp.williams_orders(5)


def test_pick_orders_williams_only_when_the_group_fills_the_rounds():
    assert pick_orders(8, 8, random.Random(1)) == vp.williams_orders(8)
    six = pick_orders(6, 8, random.Random(1))
    assert len(six) == 8 and all(sorted(r) == list(range(6)) for r in six)
    assert six == pick_orders(6, 8, random.Random(1)) != pick_orders(6, 8, random.Random(2))
    assert len(pick_orders(4, 4, random.Random(0))) == 4  # n == rounds, even: Williams of 4
    assert pick_orders(4, 4, random.Random(0)) == vp.williams_orders(4)


def test_pick_scores_by_hand():
    # net votes 8, −8, 0, 1, 2 over 8 rounds → 1, −1, 0, 0 (|1| < 2: small net vote), 2/8
    assert pick_scores([8, -8, 0, 1, 2], 8) == ([1.0, -1.0, 0.0, 0.0, 0.25], "ok")
    assert pick_scores([5, -5, 0], 5) == ([1.0, -1.0, 0.0], "ok")  # five rounds suffice
    assert pick_scores([4, -4, 0], 4) == ([0.0, 0.0, 0.0], "short")
    assert pick_scores([0, 0, 0], 8) == ([0.0, 0.0, 0.0], "no_clear_difference")


def test_query_deduct_steps_and_row_reward_by_hand():
    assert [vp.query_deduct(q) for q in (1.0, 0.9, 0.89, 0.6, 0.59, 0.4, 0.2, 0.19, 0.0)] == [
        0.0, 0.0, 0.2, 0.2, 0.4, 0.4, 0.8, None, None]
    assert row_reward(1.0, 0.95, 1.0) == 1.0  # (1 − 0 + 2)/3
    assert row_reward(1.0, 0.7, 1.0) == 0.9333  # (1 − 0.2 + 2)/3
    assert row_reward(-1.0, 0.2, 0.5) == 0.0667  # (−1 − 0.8 + 2)/3
    assert row_reward(0.5, 0.4, None) == 0.7  # (0.5 − 0.4 + 2)/3; a missing runtime factor passes
    assert row_reward(0.0, 0.95, 1.0) == 0.6667
    assert row_reward(1.0, 0.19, 1.0) == 0.0 and row_reward(1.0, 0.95, 0) == 0.0
    assert row_reward(None, 0.95, 1.0) is None and row_reward(1.0, None, 1.0) is None  # missing, not 0
    assert row_reward(None, None, 0.0) == 0.0  # the runtime gate decides without the judge


def test_read_round_refuses_inconsistent_verdicts():
    labels = ["A", "B", "C"]
    assert vp.read_round(PickVerdict(better=["c"], worse=[" A"]), labels) == (["C"], ["A"])
    assert vp.read_round(PickVerdict(better=[], worse=[]), labels) == ([], [])
    assert vp.read_round(PickVerdict(better=["D"], worse=[]), labels) is None
    assert vp.read_round(PickVerdict(better=["A"], worse=["A"]), labels) is None
    assert vp.read_round(PickVerdict(better=["B", "B"], worse=[]), labels) is None
    assert vp.read_round(None, labels) is None


def shot(i: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + f"page-{i}".encode()


def page(data: bytes) -> int:
    return int(data.rsplit(b"-", 1)[1])


class Script:
    """A judge that looks at the screenshots: ``pick(order, label_of)`` answers a round given the
    candidates in the order shown; ``fits[i]`` is candidate i's query fit (None: it answers prose)."""

    def __init__(self, pick, fits: dict[int, float | None]):
        self.pick, self.fits, self.orders, self.kinds, self.prompts = pick, fits, [], [], []

    def __call__(self, kind, prompt, sample, *, images):
        self.kinds.append(kind)
        if kind == "visual_query_fit":
            fit = self.fits[page(images[0][1])]
            return "no idea" if fit is None else json.dumps({"score": fit, "unmet": [] if fit > 0.9 else ["x"]})
        order = [page(d) for _, d in images]
        self.orders.append(order)
        self.prompts.append(prompt)
        return self.pick(order, {page(d): label for label, d in images})


def votes(better=(), worse=()):
    return lambda order, label: json.dumps({"better": [label[i] for i in better], "worse": [label[i] for i in worse],
                                            "reason": "scripted"})


def grade(script: Script, shots, factors, **kw) -> GroupResult:
    return asyncio.run(grade_group("A landing page for a bakery", shots, factors, ScriptedJudge(script, retries=0),
                                   **kw))


@pytest.mark.parametrize("fit2, reward2", [(0.95, 1.0), (0.7, 0.9333), (0.1, 0.0)])
def test_a_clear_winner_and_loser_over_williams_rounds(fit2, reward2):
    fits = {i: 0.95 for i in range(8)} | {0: 0.7, 1: 0.1, 2: fit2}
    script = Script(votes(better=[2], worse=[5]), fits)
    r = grade(script, [shot(i) for i in range(8)], [1.0] * 7 + [0.0])
    assert sorted(script.orders) == sorted(vp.williams_orders(8))
    assert (r.rounds_ok, r.rounds_failed, r.short_pick, r.no_clear_difference) == (8, 0, False, False)
    assert r.votes == [0, 0, 8, 0, 0, -8, 0, 0]
    assert r.pick_norm == [0.0, 0.0, 1.0, 0.0, 0.0, -1.0, 0.0, 0.0]
    # c0 (0 − 0.2 + 2)/3; c1 query fit under 0.2; c5 (−1 + 2)/3; c7 runtime factor 0
    assert r.reward == [0.6, 0.0, reward2, 0.6667, 0.6667, 0.3333, 0.6667, 0.0]
    assert script.kinds.count("visual_query_fit") == 7  # the gated candidate is not asked
    assert r.query_fit[7] is None and r.unmet[0] == ["x"]
    prompt = script.prompts[0]
    assert "clearly better or clearly worse" in prompt and "middling" in prompt and "Ignore functionality" in prompt


BAD = {0: "no idea", 1: '{"better": ["Z"], "worse": []}', 3: '{"better": ["A", "A"], "worse": []}'}


def flaky(failing):
    """Rounds that show one of ``failing`` first fail in different ways; the others name 2 better, 5 worse."""

    def pick(order, label):
        if order[0] not in failing:
            return votes(better=[2], worse=[5])(order, label)
        if order[0] == 2:
            return json.dumps({"better": [label[2]], "worse": [label[2]]})  # in both lists
        return BAD[order[0]]

    return pick


def test_four_failed_rounds_make_a_short_pick():
    r = grade(Script(flaky({0, 1, 2, 3}), {i: 0.95 for i in range(8)}), [shot(i) for i in range(8)], [1.0] * 8)
    assert (r.rounds_ok, r.rounds_failed, r.short_pick) == (4, 4, True)
    assert r.pick_norm == [0.0] * 8 and r.reward == [0.6667] * 8  # (0 − 0 + 2)/3


def test_five_successful_rounds_are_enough():
    r = grade(Script(flaky({0, 1, 2}), {i: 0.95 for i in range(8)}), [shot(i) for i in range(8)], [1.0] * 8)
    assert (r.rounds_ok, r.rounds_failed, r.short_pick) == (5, 3, False)
    assert r.pick_norm[2] == 1.0 and r.pick_norm[5] == -1.0  # 5/5, −5/5
    assert r.reward[2] == 1.0 and r.reward[5] == 0.3333


def test_small_net_votes_count_for_nothing():
    def pick(order, label):
        better = [2] + ([3] if order[0] == 3 else []) + ([4] if order[0] in (4, 6) else [])
        return votes(better=better, worse=[5] if order[0] == 5 else [])(order, label)

    r = grade(Script(pick, {i: 0.95 for i in range(8)}), [shot(i) for i in range(8)], [1.0] * 8)
    assert r.votes == [0, 0, 8, 1, 2, -1, 0, 0]
    assert r.pick_norm == [0.0, 0.0, 1.0, 0.0, 0.25, 0.0, 0.0, 0.0] and r.small_net_vote == 2
    assert r.reward[3] == 0.6667 and r.reward[4] == 0.75  # (0.25 + 2)/3


def test_no_clear_difference_zeroes_every_pick():
    r = grade(Script(votes(), {i: 0.95 for i in range(8)}), [shot(i) for i in range(8)], [1.0] * 8)
    assert r.no_clear_difference and not r.short_pick and r.pick_norm == [0.0] * 8 and r.reward == [0.6667] * 8

    def swing(order, label):  # named, but better as often as worse: every net vote 0
        one, other = (1, 6) if order[0] % 2 else (6, 1)
        return votes(better=[one], worse=[other])(order, label)

    r = grade(Script(swing, {i: 0.95 for i in range(8)}), [shot(i) for i in range(8)], [1.0] * 8)
    assert r.no_clear_difference and r.votes[1] == r.votes[6] == 0


def test_a_missing_query_fit_is_a_missing_result_not_a_zero():
    fits = {i: 0.95 for i in range(8)} | {4: None}
    r = grade(Script(votes(better=[2], worse=[5]), fits), [shot(i) for i in range(8)], [1.0] * 8)
    assert r.query_missing == 1 and r.query_fit[4] is None and r.reward[4] is None and r.missing == 1
    assert r.reward[2] == 1.0 and r.reward[5] == 0.3333 and r.reward[0] == 0.6667
    assert r.metrics()["visual_query_missing"] == 1.0


def test_no_answered_round_is_a_missing_pick():
    fits = {i: 0.95 for i in range(8)} | {1: 0.1}
    r = grade(Script(lambda order, label: "no idea", fits), [shot(i) for i in range(8)], [1.0] * 7 + [0.0])
    assert r.pick_missing and not r.short_pick and r.rounds_failed == 8
    assert r.reward == [None, 0.0, None, None, None, None, None, 0.0]  # query fit < 0.2 and the gate still decide


def test_only_candidates_with_a_screenshot_take_part():
    shots = [shot(0), None, shot(2), None, shot(4), shot(5)]
    factors = [None, 0.0, 1.0, 1.0, 1.0, 1.0]  # 0: no factor (passes); 1: gated; 3: no screenshot yet not gated
    script = Script(votes(better=[2], worse=[5]), {i: 0.95 for i in range(6)})
    r = grade(script, shots, factors, seed=7)
    expected = [[[0, 2, 4, 5][j] for j in o] for o in pick_orders(4, 8, random.Random(7))]
    assert sorted(script.orders) == sorted(expected) and len(script.orders) == 8
    assert r.pick_norm == [0.0, None, 1.0, None, 0.0, -1.0]
    assert r.reward == [0.6667, 0.0, 1.0, None, 0.6667, 0.3333]
    assert script.kinds.count("visual_query_fit") == 4


def test_the_pick_prompt_names_the_labels_and_leaves_requirements_out():
    p = vp.pick_prompt("x" * 5000, ["A", "B", "C"])
    assert "labelled A, B, C in the order shown" in p and "[... 1000 chars cut]" in p
    assert "whether the page satisfies the request" in p
