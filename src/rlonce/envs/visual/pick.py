"""The visual reward of one group: a group-relative aesthetic pick, a query-fit deduction, a runtime gate.

A judge sees the group's screenshots, labelled A, B, C… in one round's order, and names only the
clearly better and the clearly worse pages (middling ones stay unnamed: no forced total ranking);
functionality and requirement satisfaction are left out of this aesthetic judgment. Eight rounds
run, in Williams orders when the group has eight pages (every page once in each position, every
ordered neighbour pair once, against position effects) and in seeded random orders otherwise. A
page's net vote over the successful rounds, divided by their number, is its ``pick_norm`` in
[−1, 1]; fewer than ``MIN_ROUNDS`` successful rounds, no clear difference, or a net vote under
``NET_VOTE_MIN`` leave it 0. A second question per page, its query fit (does it do what was
asked), becomes a deduction, and the reward of a row is ``(pick_norm − deduct + 2) / 3``.

Where this departs from the public reward: a pick or query-fit answer that is missing is a
missing result (reward ``None``, the row an infrastructure failure), never a 0 and never the group
mean. Only pages with a screenshot take part in the rounds; a page whose runtime factor is 0 gets
reward 0 whatever the judge says, and is not asked about its query fit.

``rlonce.envs`` sits below ``rlonce.grading`` (tests/unit/test_layers.py), so this module asks a
``rlonce.envs.base.JudgeBinding`` (``rlonce.grading.judge.Judge`` is one) and holds its own
verdict schemas.
"""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from rlonce.envs.base import JudgeBinding

ROUNDS = 8
"""Pick rounds per group."""
MIN_ROUNDS = 5
"""Successful rounds needed for any nonzero pick score."""
NET_VOTE_MIN = 2
"""Smallest |net vote| that counts; a page named on balance once is noise."""
DEDUCTIONS = ((0.9, 0.0), (0.6, 0.2), (0.4, 0.4), (0.2, 0.8))
"""(lowest query fit, deduction), best first; below the last the reward is 0."""
REQUEST_CHARS = 4000
"""Characters of the request quoted in a prompt."""
LABELS = string.ascii_uppercase


class PickVerdict(BaseModel):
    """One pick round: the labels of the clearly better and the clearly worse pages."""

    model_config = ConfigDict(extra="ignore")
    better: list[str]
    worse: list[str]
    reason: str = ""


class QueryFit(BaseModel):
    """How far one page satisfies the request, and what it leaves unmet."""

    model_config = ConfigDict(extra="ignore")
    score: float = Field(ge=0, le=1)
    unmet: list[str] = []


def williams_orders(n: int) -> list[list[int]]:
    """The ``n`` rows of a Williams design for even ``n``: row 0 is 0, 1, n−1, 2, n−2, …; row r
    adds r (mod n). Each candidate stands once in each position, each ordered pair of neighbours
    occurs once."""
    if n < 2 or n % 2:
        raise ValueError(f"a Williams design of one square needs an even n >= 2, not {n}")
    row0, low, high = [0], 1, n - 1
    while len(row0) < n:
        row0.append(low)
        low += 1
        if len(row0) < n:
            row0.append(high)
            high -= 1
    return [[(x + r) % n for x in row0] for r in range(n)]


def pick_orders(n: int, rounds: int = ROUNDS, rng: random.Random | None = None) -> list[list[int]]:
    """The candidate order of each round: Williams when ``n == rounds`` and ``n`` is even, else
    ``rounds`` random permutations drawn from ``rng`` (seeded by the caller)."""
    if n == rounds and n % 2 == 0:
        return williams_orders(n)
    rng = rng or random.Random(0)
    return [rng.sample(range(n), n) for _ in range(rounds)]


def _cut(text: str) -> str:
    if len(text) <= REQUEST_CHARS:
        return text
    return text[:REQUEST_CHARS] + f"\n[... {len(text) - REQUEST_CHARS} chars cut]"


def pick_prompt(request: str, labels: Sequence[str]) -> str:
    names = ", ".join(labels)
    return (f"## Request (context only)\n{_cut(request)}\n\n## Candidates\nThe {len(labels)} screenshots below are web "
            f"pages made for this request, labelled {names} in the order shown.\n\nJudge only their visual and "
            "aesthetic quality: layout, spacing, alignment, typography, colour, visual hierarchy, polish. Ignore "
            "functionality, correctness and whether the page satisfies the request; that is judged elsewhere. Do "
            "not rank them all: name only candidates that are clearly better or clearly worse than the others, "
            "leave middling ones out, and leave both lists empty when none clearly stands out. Answer: "
            '{"better": ["<label>", ...], "worse": ["<label>", ...], "reason": "..."}')


def query_fit_prompt(request: str) -> str:
    return (f"## Request\n{_cut(request)}\n\n## The page\nThe screenshot below shows the page made for this "
            "request.\n\nDoes the page satisfy the request: the content it asks for, the sections, every stated "
            "requirement? Judge what the request asks, not beauty or style. Score 1.0 when everything asked for is "
            "there, 0.0 when the page is unrelated, and list what is missing or wrong. Answer: "
            '{"score": 0.0, "unmet": ["..."]}')


def read_round(verdict: PickVerdict | None, labels: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """The round's (better, worse) labels, or None when it failed: no verdict, an unknown label,
    a label named twice or in both lists."""
    if verdict is None:
        return None
    better = [x.strip().upper() for x in verdict.better]
    worse = [x.strip().upper() for x in verdict.worse]
    named = better + worse
    if len(set(named)) != len(named) or not set(named) <= set(labels):
        return None
    return better, worse


def pick_scores(votes: Sequence[int], successful_rounds: int) -> tuple[list[float], str]:
    """Each candidate's ``pick_norm`` from its net vote (+1 per round named better, −1 per round
    named worse) and why they are what they are: 'short' (fewer than ``MIN_ROUNDS`` successful
    rounds: all 0), 'no_clear_difference' (every net vote 0) or 'ok' (votes / rounds, except a
    |net vote| under ``NET_VOTE_MIN``: 0)."""
    if successful_rounds < MIN_ROUNDS:
        return [0.0] * len(votes), "short"
    if not any(votes):
        return [0.0] * len(votes), "no_clear_difference"
    return [v / successful_rounds if abs(v) >= NET_VOTE_MIN else 0.0 for v in votes], "ok"


def query_deduct(qf: float) -> float | None:
    """The deduction for query fit ``qf``; None below the last step (the reward is 0)."""
    for lowest, deduct in DEDUCTIONS:
        if qf >= lowest:
            return deduct
    return None


def row_reward(pick_norm: float | None, qf: float | None, runtime_factor: float | None = 1.0) -> float | None:
    """A row's reward, ``round((pick_norm − deduct + 2) / 3, 4)``; 0 when the runtime factor is
    exactly 0 or the query fit is under 0.2; None (a missing result, not a score) when the pick or
    the query fit is missing. A missing runtime factor passes the gate."""
    if runtime_factor is not None and runtime_factor == 0:
        return 0.0
    if qf is None:
        return None
    deduct = query_deduct(qf)
    if deduct is None:
        return 0.0
    if pick_norm is None:
        return None
    return round((pick_norm - deduct + 2) / 3, 4)


@dataclass
class GroupResult:
    """Per candidate (None where it has no value: not shown, or the answer is missing) and the
    group's counts."""

    pick_norm: list[float | None]
    query_fit: list[float | None]
    reward: list[float | None]
    """None: a missing result — the row is an infrastructure failure, never a 0."""
    votes: list[int | None]
    unmet: list[list[str]]
    rounds_ok: int = 0
    rounds_failed: int = 0
    pick_missing: bool = False
    """Rounds were run and none answered: every pick is a missing result (not a short pick's 0)."""
    short_pick: bool = False
    no_clear_difference: bool = False
    small_net_vote: int = 0
    """Candidates named on balance, but fewer than ``NET_VOTE_MIN`` times (their pick is 0)."""
    query_missing: int = 0

    @property
    def missing(self) -> int:
        return sum(r is None for r in self.reward)

    def metrics(self) -> dict[str, float]:
        return {"visual_rounds_ok": float(self.rounds_ok), "visual_rounds_failed": float(self.rounds_failed),
                "visual_pick_missing": float(self.pick_missing), "visual_short_pick": float(self.short_pick),
                "visual_no_clear_difference": float(self.no_clear_difference),
                "visual_small_net_vote": float(self.small_net_vote),
                "visual_query_missing": float(self.query_missing), "visual_missing": float(self.missing)}


async def _pick_round(judge: JudgeBinding, request: str, shown: list[tuple[int, bytes]], sample: int
                      ) -> tuple[list[int], list[int]] | None:
    """One round over ``shown`` — (candidate, screenshot) in this round's order: the candidates
    named better and worse, or None when the round failed."""
    labels = list(LABELS[:len(shown)])
    images = [(label, shot) for label, (_, shot) in zip(labels, shown)]
    v = await judge.ask(pick_prompt(request, labels), PickVerdict, kind="visual_pick", sample=sample, images=images)
    got = read_round(v.value if v.ok else None, labels)
    if got is None:
        return None
    who = {label: i for label, (i, _) in zip(labels, shown)}
    return [who[x] for x in got[0]], [who[x] for x in got[1]]


async def _query_fit(judge: JudgeBinding, request: str, shot: bytes) -> QueryFit | None:
    v = await judge.ask(query_fit_prompt(request), QueryFit, kind="visual_query_fit", images=[("page", shot)])
    return v.value if v.ok else None


def _tally(picks: list[tuple[list[int], list[int]] | None], shown: list[int]) -> dict[int, int]:
    """Each shown candidate's net vote over the successful rounds."""
    votes = dict.fromkeys(shown, 0)
    for got in picks:
        if got is not None:
            for i in got[0]:
                votes[i] += 1
            for i in got[1]:
                votes[i] -= 1
    return votes


async def grade_group(request: str, shots: Sequence[bytes | None], runtime_factors: Sequence[float | None],
                      judge: JudgeBinding, *, rounds: int = ROUNDS, seed: int = 0) -> GroupResult:
    """The group's rewards: ``rounds`` pick rounds over the candidates with a screenshot and one
    query-fit question per shown candidate whose runtime factor is not 0, all asked at once (the
    judge bounds its own concurrency). A candidate without a screenshot gets 0 when its runtime
    factor is 0 and a missing result otherwise; so does every shown candidate when no pick round
    was answered (1–4 answered rounds are a short pick: 0)."""
    n = len(shots)
    if len(runtime_factors) != n:
        raise ValueError(f"{n} screenshots but {len(runtime_factors)} runtime factors")
    shown = [i for i, s in enumerate(shots) if s is not None]
    if len(shown) > len(LABELS):
        raise ValueError(f"{len(shown)} candidates: the pick labels A–Z name at most {len(LABELS)}")
    orders = pick_orders(len(shown), rounds, random.Random(seed)) if len(shown) >= 2 else []
    asked = [i for i in shown if runtime_factors[i] is None or runtime_factors[i] != 0]
    rounds_shown = [[(shown[j], shots[shown[j]]) for j in order] for order in orders]
    answers = await asyncio.gather(
        *(_pick_round(judge, request, these, r) for r, these in enumerate(rounds_shown)),
        *(_query_fit(judge, request, shots[i]) for i in asked))
    picks, fits = answers[:len(orders)], dict(zip(asked, answers[len(orders):]))
    votes, ok = _tally(picks, shown), sum(got is not None for got in picks)
    missing = bool(orders) and not ok
    norms, why = pick_scores([votes[i] for i in shown], ok)
    pick = dict.fromkeys(shown) if missing else dict(zip(shown, norms))
    qf = {i: (f.score if f else None) for i, f in fits.items()}
    return GroupResult(
        pick_norm=[pick.get(i) for i in range(n)], query_fit=[qf.get(i) for i in range(n)],
        reward=[row_reward(pick.get(i), qf.get(i), runtime_factors[i]) for i in range(n)],
        votes=[votes.get(i) for i in range(n)], unmet=[list(fits[i].unmet) if fits.get(i) else [] for i in range(n)],
        rounds_ok=ok, rounds_failed=len(picks) - ok, pick_missing=missing,
        short_pick=why == "short" and not missing,
        no_clear_difference=why == "no_clear_difference",
        small_net_vote=sum(0 < abs(v) < NET_VOTE_MIN for v in votes.values()) if why == "ok" else 0,
        query_missing=sum(f is None for f in fits.values()))
