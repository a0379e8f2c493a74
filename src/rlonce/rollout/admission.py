"""Admission: which sources start a new group now.

New groups start greedily by mixer weight under per-source concurrency budgets (Little's law,
``SampleMixer.concurrency``), a cap on concurrent sessions and a budget of predicted KV tokens
(the source's mean context length × group size). The orchestrator runs a round after every
finished group (async mode); the round only reads the buffer and the mixer and starts groups
through the orchestrator's ``dispatch``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from rlonce.rollout.groups import FINISHED, PENDING, RUNNING, Group
from rlonce.rollout.mixer import SampleMixer


class Limits(Protocol):
    """The settings a round reads (``OrchestratorSettings`` has them)."""

    group_size: int
    max_sessions: int
    kv_budget: float
    staleness: int

    def rule(self, source: str): ...

    def size(self, source: str) -> int: ...


def dispatch_round(groups: Iterable[Group], mx: SampleMixer, st: Limits, interval: float | None,
                   dispatch: Callable[[str], object]) -> int:
    """Start every group admission allows now with ``dispatch(source)``; returns how many. One pass
    over the buffer's ``groups``, the mixer's numbers computed once: this runs after every finished
    group.

    A source *wants* work while its expected yield — accepted groups waiting plus in-flight
    groups times their acceptance — is short of ``B_i · (1 + p_i · min(d - 1, t_i / T))``: this
    step's target, plus what must already be in flight to cover the source's rollout duration
    ``t_i`` in units of the measured step interval ``T`` (``interval``; Little's law), with the
    mixer's oversampling ``p_i`` as headroom, at most ``d - 1 = min(2, staleness) - 1`` steps ahead
    (the source's own staleness; a deeper pipe only goes stale). Sources are tried by mixer weight, first within their
    Little's-law budgets, then — so that no slot idles while some source wants work — within the
    session cap alone."""
    p, _ = mx.oversampling()
    budgets = mx.concurrency(max(1, st.max_sessions // st.group_size), p)  # in groups of the run's size
    flight, acc = Counter(), Counter()
    kv, sessions = 0.0, 0
    for g in groups:
        if g.state in (PENDING, RUNNING):
            flight[g.source] += 1
            sessions += st.size(g.source)
            kv += mx.sources[g.source].tokens * st.size(g.source)
        elif g.state == FINISHED and g.accepted:
            acc[g.source] += 1
    weights = mx.weights(dict(acc))
    order = sorted(weights, key=lambda n: -weights[n])
    depth = {n: min(2, st.rule(n).staleness) for n in mx.sources}  # each source's own bound
    floor = mx.settings.min_acceptance

    def want(n: str) -> bool:
        src = mx.sources[n]
        if interval:  # Little's law: what is in flight must cover the source's latency in steps
            ahead = min(depth[n] - 1.0, src.duration / interval) * p[n]
        else:
            ahead = (depth[n] - 1.0) * p[n]
        return acc[n] + flight[n] * max(src.acceptance, floor) < src.target * (1.0 + ahead)

    started = 0
    for soft in (False, True):
        progress = True
        while progress:
            progress = False
            for n in order:
                cost = mx.sources[n].tokens * st.size(n)
                if sessions + st.size(n) > st.max_sessions or (flight and kv + cost > st.kv_budget):
                    return started
                if want(n) and (soft or flight[n] < budgets[n]):
                    dispatch(n)
                    flight[n] += 1
                    sessions += st.size(n)
                    kv += cost
                    started += 1
                    progress = True
                    break
    return started
