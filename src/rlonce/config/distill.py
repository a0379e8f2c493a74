"""The ``[distill]`` table: on-policy distillation from teachers, MOPD2's multi-prefix,
multi-teacher form (docs/distillation.md). A source distils when it has a teacher (its own
``teacher`` in ``[[sources]]``, else ``distill.teacher``); ``rlonce.distill`` does the work."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlonce.config.sections import Section

PrefixMode = Literal["none", "sft", "teacher"]


def check_teacher(value: str | None) -> str | None:
    """A teacher is 'embedded', 'smollm2', a model folder, a run directory (its latest checkpoint) or
    a hub id in the local cache. Only its form is checked here; it is loaded when the run starts."""
    if value is None:
        return None
    if not value.strip() or any(ord(c) < 32 for c in value):
        raise ValueError("a teacher is a model name, a model folder or a run directory")
    if value.startswith(("http://", "https://")):
        raise ValueError(f"teacher {value!r}: endpoint teachers are not supported yet; give a model folder or a run "
                         "directory (docs/distillation.md)")
    return value


class DistillConfig(Section):
    """On-policy distillation (seed 001, MOPD2): the student samples, the source's teacher scores the
    student's tokens, and each token's advantage is ``kl_weight · (log π_teacher − log π_student)``
    — the per-token reverse KL as a reward — plus ``rl.reward_weight`` times the group advantage."""

    teacher: str | None = None
    """The teacher of every source that names none of its own (None: only sources with a ``teacher``
    distil). 'embedded', 'smollm2', a model folder, a run directory (its latest checkpoint) or a hub
    id in the local cache; it must share the student's tokenizer."""
    kl_weight: float = Field(1.0, ge=0, le=1000)
    """Weight of the per-token reverse-KL advantage (a source's ``kl_weight`` overrides it)."""
    prefix: PrefixMode = "none"
    """Where each sequence starts: 'none' (the task's start: plain on-policy distillation), 'sft' (a
    scripted-expert demonstration's first j turns, SFT-prefix OPD), 'teacher' (the first j turns of
    the teacher's own rollout of the task); sibling k of a group takes j = k mod (the trajectory's
    turns). Prefix turns are replayed through the harness and sandbox, so every observation is exact;
    they are never trained."""
    student_turns: int | None = Field(None, ge=0, le=1000)
    """Turns the student samples after the prefix (0: the rest of the episode). Default: 1 with a
    prefix (MOPD2: one new turn per prefix), the whole episode without."""
    teacher_batch_tokens: int = Field(8192, ge=64, le=10_000_000)
    """Tokens per teacher forward pass when a local teacher scores a group's contexts."""

    @field_validator("teacher")
    @classmethod
    def _teacher(cls, v):
        return check_teacher(v)
