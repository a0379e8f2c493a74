"""How an episode ends: typed exceptions raised inside the loop, caught in one place."""

from __future__ import annotations


class EpisodeEnd(Exception):
    """Base of every normal way an episode ends."""


class Submitted(EpisodeEnd):
    def __init__(self, answer: str):
        super().__init__(answer)
        self.answer = answer


class LimitsExceeded(EpisodeEnd):
    """Turn, token or context budget exhausted: the sequence is truncated."""


class FormatError(EpisodeEnd):
    """The model's turn could not be parsed into a usable tool call."""
