"""The ``[distill]`` table: on-policy distillation from teachers, MOPD2's multi-prefix,
multi-teacher form (docs/distillation.md). A source distils when it has a teacher (its own
``teacher`` in ``[[sources]]``, else ``distill.teacher``); ``rlonce.distill`` does the work.
A teacher is a model loaded in the run or an OpenAI-compatible endpoint that returns prompt
log-probs (``rlonce.distill.endpoint``), named by its base URL."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlonce.config.sections import Section

PrefixMode = Literal["none", "sft", "teacher"]


def is_endpoint(teacher: str | None) -> bool:
    """Whether ``teacher`` names an endpoint (an http(s) base URL) rather than a model."""
    return teacher is not None and teacher.lower().startswith(("http://", "https://"))


def check_teacher(value: str | None) -> str | None:
    """A teacher is 'embedded', 'smollm2', a model folder, a run directory (its latest checkpoint), a
    hub id in the local cache, or the base URL of an OpenAI-compatible endpoint, ending in /v1. Only
    its form is checked here; it is loaded (or first asked) when the run starts."""
    if value is None:
        return None
    if not value.strip() or any(ord(c) < 32 for c in value):
        raise ValueError("a teacher is a model name, a model folder, a run directory or an endpoint's base URL")
    if is_endpoint(value):
        from urllib.parse import urlsplit

        try:
            url = urlsplit(value)
            ok = bool(url.hostname) and (url.port is None or url.port > 0)
        except ValueError:  # a malformed host or port
            ok = False
        if not ok or url.query or url.fragment or not url.path.rstrip("/").endswith("/v1") or " " in value:
            raise ValueError(f"teacher {value!r}: an endpoint teacher is the server's OpenAI base URL, ending in /v1 "
                             "(as http://127.0.0.1:8000/v1)")
        return value.rstrip("/")
    return value


class DistillConfig(Section):
    """On-policy distillation (seed 001, MOPD2): the student samples, the source's teacher scores the
    student's tokens, and each token's advantage is ``kl_weight · (log π_teacher − log π_student)``
    — the per-token reverse KL as a reward — plus ``rl.reward_weight`` times the group advantage."""

    teacher: str | None = None
    """The teacher of every source that names none of its own (None: only sources with a ``teacher``
    distil). 'embedded', 'smollm2', a model folder, a run directory (its latest checkpoint), a hub id
    in the local cache, or an OpenAI-compatible endpoint's base URL ending in /v1 (vLLM's server,
    ``rlonce serve``: it scores the student's tokens with prompt log-probs; its source samples at
    temperature 1 without top-p/top-k, and takes no 'teacher' prefixes). It must share the student's
    tokenizer (an endpoint's cannot be checked)."""
    kl_weight: float = Field(1.0, ge=0, le=1000)
    """Weight of the per-token reverse-KL advantage (a source's ``kl_weight`` overrides it)."""
    clip: float | None = Field(None, gt=0, le=1000)
    """Bound on each token's log π_teacher − log π_student in the advantage, to [−clip, clip]
    (unset: unbounded). The metric ``distill_reverse_kl`` stays unclipped."""
    topk: int = Field(0, ge=0, le=1024)
    """With k > 0 the teacher also gives its k most likely tokens at each trained position, and the
    loss adds ``topk_weight`` times KL(teacher ‖ student) over those k tokens and the rest of the
    vocabulary as one bin (``rlonce.algo.losses.topk_kl``): it reaches tokens the student rarely
    samples, which the sampled reverse KL cannot. Scored over the whole vocabulary at the row's
    temperature. An endpoint teacher is asked for ``prompt_logprobs`` = k (once before the run:
    a server whose limit is lower stops it with one line; vLLM's ``--max-logprobs`` is 20 by default)."""
    topk_weight: float = Field(1.0, ge=0, le=1000)
    """Weight of the top-k term in the loss (with ``topk`` > 0)."""
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
    teacher_model: str = "teacher"
    """The model name sent to an endpoint teacher (the ``model`` of each scoring request: the name
    the server was started with, as vLLM's ``--served-model-name``)."""
    teacher_timeout_s: float = Field(600.0, gt=0, le=86_400)
    """Seconds one scoring request to an endpoint teacher may take; past them the group is an
    infrastructure failure (engine_error), never trained."""
    teacher_concurrency: int = Field(8, ge=1, le=1024)
    """Scoring requests in flight at once to an endpoint teacher (one per context of a group)."""
    teacher_api_key_env: str = ""
    """Name of the environment variable holding an endpoint teacher's key ('' sends the placeholder
    'EMPTY', what vLLM expects without ``--api-key``). The key itself is never in the config or the
    run directory."""

    @field_validator("teacher")
    @classmethod
    def _teacher(cls, v):
        return check_teacher(v)
