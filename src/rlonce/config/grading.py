"""The ``[grading]`` table: the model judge and what it is asked during a run (docs/grading.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlonce.config.sections import MAX_PARALLEL, MAX_TOKENS, Section

MAX_JUDGE_SECONDS = 86_400.0


class JudgeConfig(Section):
    """A judge: a model behind an OpenAI-compatible or Anthropic endpoint, or the scripted one."""

    @model_validator(mode="after")
    def _endpoint(self):
        if self.kind == "endpoint" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge base_url {self.base_url!r} is not an http(s) URL: give e.g. "
                             "'http://127.0.0.1:8000/sessions/{call}/v1' for `rlonce serve`")
        return self

    kind: Literal["none", "scripted", "endpoint"] = "none"
    """'none' (no judge: grader outputs fall back), 'scripted' (rlonce's deterministic rule judge, for
    tests and CPU runs) or 'endpoint' (a model at ``base_url``)."""
    base_url: str = "http://127.0.0.1:8000/sessions/{call}/v1"
    """OpenAI protocol: the URL before ``/chat/completions`` (ends in /v1); Anthropic: before
    ``/v1/messages``. ``{call}`` becomes a fresh id per call (``rlonce serve`` needs one session per
    concurrent call)."""
    model: str = Field("judge", min_length=1)
    """The model name sent in each request."""
    protocol: Literal["openai", "anthropic"] = "openai"
    """The endpoint's wire protocol: OpenAI Chat Completions or Anthropic Messages."""
    api_key_env: str = ""
    """Name of the environment variable holding the key ('' sends a placeholder key). The key itself
    is never in the config or the run directory."""
    timeout_s: float = Field(120.0, gt=0, le=MAX_JUDGE_SECONDS)
    """Seconds one call may take; then it counts as 'timeout' (and is retried)."""
    retries: int = Field(1, ge=0, le=10)
    """Further tries of a call that failed (down, timeout, error status, unparseable reply)."""
    concurrency: int = Field(4, ge=1, le=MAX_PARALLEL)
    """Calls in flight at once (``executor = "ray"``: shared out equally among the harness pools, at
    least one each)."""
    max_tokens: int = Field(384, ge=1, le=MAX_TOKENS)
    """Reply token cap per call."""
    temperature: float = Field(0.0, ge=0, le=2)
    """Sampling temperature (the agreement check's second sample needs > 0 to differ)."""
    vision: bool = False
    """The endpoint accepts images (screenshots sent as the protocol's image parts); open-ended
    visual tasks need it."""
    agentic: bool = False
    """Group comparison (GAR) and hack audits run as an agent in a sandbox holding the task's
    workspace and every attempt's change, with bash (``rlonce.grading.agentic``)."""
    agent_turns: int = Field(8, ge=1, le=1000)
    """Turns an agentic grader may take before it must submit its verdict."""


class GradingConfig(Section):
    """Model graders during a run: GRS rubric scores (``algo.grs``), GAR quality factors
    (``algo.gar``) and the training-time hack audit, all asked of ``judge`` (docs/grading.md)."""

    judge: JudgeConfig = JudgeConfig()
    """The judge every grader asks."""
    agreement_judge: JudgeConfig = JudgeConfig()
    """A second judge for the agreement check ('none': a second sample of ``judge``)."""
    audit_fraction: float = Field(0.0, ge=0, le=1)
    """Share of the finished sequences the hack auditor reviews (a seeded draw), besides every passing
    sequence of ``audit_sources``."""
    audit_sources: list[str] = []
    """Sources (labels) flagged for auditing: every passing sequence of theirs is audited."""
    agreement_fraction: float = Field(0.0, ge=0, le=1)
    """Share of audited sequences judged a second time, for Cohen's κ between the two verdicts."""
    deadline_s: float = Field(600.0, ge=0, le=MAX_JUDGE_SECONDS)
    """Longest time one group may wait for its graders; later output is dropped and the group keeps
    its test rewards and advantages (0: no limit)."""

    @property
    def enabled(self) -> bool:
        return self.judge.kind != "none"
