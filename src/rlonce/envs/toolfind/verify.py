"""Exact-answer verifier for toolfind: 1.0 when the submitted word is the answer, else 0.0."""

from __future__ import annotations


def normalize(answer: str) -> str:
    return " ".join(answer.strip().strip(".\"'").lower().split())


def score(expected: str, submitted: str | None) -> float:
    if submitted is None:
        return 0.0
    return 1.0 if normalize(submitted) == normalize(expected) else 0.0
