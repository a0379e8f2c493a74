"""The Penalty Module: rules detect, strategies act, escalation counts what was lost.

Seed 001 ("A trajectory is not one long chat string"): a *rule* detects something on segments
(repetition, a run of near-certain tokens, a malformed or unknown tool call, garbled output,
an infrastructure failure); a *strategy* decides what to do (``monitor``, ``mask`` the tokens,
``adv_set`` / ``adv_reduction`` on their advantages, ``adv_signed`` — the signed rebalance of
``rlonce.algo.shaping``, run over the step's batch with the aggregation's token weights).
Escalation: a context with no surviving model tokens is dropped; a sequence with no surviving
context loses its advantage; a sample with no surviving sequence is rejected. Each step of
that is counted by ``rlonce.algo.signal``.

Rules write their verdict onto the segment (``Segment.flags[rule] = True``), so the finding
travels with the record into trajectories and reports; strategies read it back by name.
The ``confident_run`` rule is MiniMax-M1's repetition detector (§4, a run of N consecutive
tokens each sampled with probability > 0.99); the torch engine applies the same test online
as a stop rule (``SamplingParams.stop_confident_run``), ending such a turn with finish reason
``repetition``, which this rule also flags.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlonce.algo.shaping import signed_rebalance
from rlonce.core.records import Sample, Segment, Sequence

# ---- rules: (segment, sequence, decode, **params) -> bool -------------------------------------

def ngram_repetition(seg: Segment, seq: Sequence, decode, *, n: int = 8, min_repeats: int = 4) -> bool:
    """Some n-gram of ``n`` tokens occurs at least ``min_repeats`` times in the segment."""
    ids = seg.token_ids
    if len(ids) < n * min_repeats:
        return False
    counts = Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return max(counts.values()) >= min_repeats


def longest_confident_run(logprobs: list[float], p: float = 0.99) -> int:
    """Length of the longest run of consecutive tokens each sampled with probability > ``p``."""
    thr = math.log(p)
    best = cur = 0
    for lp in logprobs:
        cur = cur + 1 if lp > thr else 0
        best = max(best, cur)
    return best


def confident_run(seg: Segment, seq: Sequence, decode, *, run: int = 3000, p: float = 0.99) -> bool:
    """M1's rule: ``run`` consecutive tokens each with probability > ``p`` (or the engine stopped
    the turn for exactly that)."""
    return seg.finish_reason == "repetition" or longest_confident_run(seg.logprobs or [], p) >= run


def bad_tool_call(seg: Segment, seq: Sequence, decode) -> bool:
    """The harness flagged this turn's tool call as malformed or naming an unknown tool."""
    return bool(seg.flags.get("malformed_tool_call") or seg.flags.get("unknown_tool"))


def garbled(seg: Segment, seq: Sequence, decode, *, max_bad_share: float = 0.0) -> bool:
    """The decoded text has more than ``max_bad_share`` replacement or control characters
    (undecodable byte sequences, stray control codes); newline and tab are fine."""
    if decode is None:
        raise ValueError("the 'garbled' penalty rule needs a decode function")
    text = decode(seg.token_ids)
    if not text:
        return False
    bad = sum(ch == "\ufffd" or (unicodedata.category(ch) == "Cc" and ch not in "\n\t\r") for ch in text)
    return bad / len(text) > max_bad_share


def infra_failure(seg: Segment, seq: Sequence, decode) -> bool:
    """The sequence failed in the infrastructure (monitored; such sequences are never trained on)."""
    return seq.infra_failed


RULES: dict[str, Callable[..., bool]] = {
    "repetition": ngram_repetition,
    "confident_run": confident_run,
    "tool_call": bad_tool_call,
    "garbled": garbled,
    "infra": infra_failure,
}


# ---- strategies ------------------------------------------------------------------------------

def _monitor(adv_T, mask_T, hit_T):
    return adv_T, mask_T


def _mask(adv_T, mask_T, hit_T):
    return adv_T, mask_T & ~hit_T


def _adv_set(adv_T, mask_T, hit_T, *, value: float = 0.0):
    return torch.where(hit_T, torch.full_like(adv_T, value), adv_T), mask_T


def _adv_reduction(adv_T, mask_T, hit_T, *, amount: float = 0.5):
    return torch.where(hit_T, adv_T - amount, adv_T), mask_T


ROW_STRATEGIES: dict[str, Callable] = {"monitor": _monitor, "mask": _mask, "adv_set": _adv_set,
                                       "adv_reduction": _adv_reduction}
BATCH_STRATEGIES: dict[str, Callable] = {"adv_signed": signed_rebalance}
"""Strategies over the live tokens of a step's whole batch, token-weighted (``rebalance_batch``)."""
STRATEGIES = sorted([*ROW_STRATEGIES, *BATCH_STRATEGIES])


@dataclass
class PenaltySpec:
    """One rule paired with one strategy; ``rule_params`` and ``strategy_params`` go to each."""

    rule: str
    strategy: str = "monitor"
    rule_params: dict = field(default_factory=dict)
    strategy_params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown penalty rule {self.rule!r}; known: {sorted(RULES)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown penalty strategy {self.strategy!r}; known: {STRATEGIES}")


def detect(samples: list[Sample], specs: list[PenaltySpec], decode=None) -> dict[str, int]:
    """Run every rule over every model segment; mark hits on ``Segment.flags``. Returns, per
    rule, the number of flagged segments and of sequences with at least one."""
    counts: dict[str, int] = {}
    for spec in specs:
        rule = RULES[spec.rule]
        segs = seqs = 0
        for sample in samples:
            for seq in sample.sequences:
                hit_any = False
                for ctx in seq.contexts:
                    for seg in ctx.segments:
                        if seg.trainable and rule(seg, seq, decode, **spec.rule_params):
                            seg.flags[spec.rule] = True
                            segs += 1
                            hit_any = True
                seqs += hit_any
        counts[f"penalty_{spec.rule}_segments"] = segs
        counts[f"penalty_{spec.rule}_sequences"] = seqs
    return counts


def flagged_tokens(seq: Sequence, rule: str) -> list[list[bool]]:
    """Per context, per token: does the token belong to a model segment flagged by ``rule``."""
    return [[bool(seg.trainable and seg.flags.get(rule)) for seg in ctx.segments for _ in seg.token_ids]
            for ctx in seq.contexts]
