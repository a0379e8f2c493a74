"""Task sources: what one RL run trains on, as a mixture (seed 001: "A prompt is sampled from the
union of task datasets. Its group of rollouts is compared within that task").

A ``[[sources]]`` table names a domain with its options (the keys of ``[task]``) and what the
runtime owes it: a share of every step's accepted batch, harness arms, sampling, a staleness
limit and what happens to a group that exceeds it, a held-out evaluation size, SFT
demonstrations and an online difficulty filter. A run without ``[[sources]]`` is the one-source
run ``[task]`` describes. ``rlonce.rollout.sources.plan_sources`` resolves either with every
default filled in from the run's other tables.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from rlonce.config.domains import DEFAULT_DOMAIN, DomainOptions, load_domain
from rlonce.config.sections import MAX_STEPS, MAX_TOKENS, ArmName, Section, bounds


class TaskConfig(Section):
    """``[task]``: the domain of a one-source run and its options. Every key besides ``name`` is the
    domain's own (its ``DomainSpec.options``), checked against that domain's options model."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(DEFAULT_DOMAIN, min_length=1, max_length=256)
    """The domain: a built-in one (``rlonce domains`` lists them with what each needs), one an
    installed package registers, or a plugin given as ``'package.module:DOMAIN'`` (docs/domains.md)."""
    _where: ClassVar[str] = "task"

    @model_validator(mode="after")
    def _domain_options(self):
        """The keys besides ``name`` (and a source's own) must be the domain's options: they are
        checked by its model and stored with every default filled in (``rlonce config show``)."""
        spec = load_domain(self.name)
        given = dict(self.__pydantic_extra__ or {})
        try:
            options = spec.options.model_validate(given)
        except ValidationError as e:
            raise ValueError(_options_error(e, self._where, self.name, spec.options)) from None
        self.__pydantic_extra__ = options.model_dump()
        return self

    @property
    def source_label(self) -> str:
        """The label in the ledger, metrics and report: a source's ``label``, else its domain's name."""
        return getattr(self, "label", None) or load_domain(self.name).name

    def domain_options(self) -> DomainOptions:
        """The domain's options object (what ``DomainSpec.build`` takes)."""
        return load_domain(self.name).options.model_validate(self.__pydantic_extra__ or {})


def _options_error(err: ValidationError, where: str, domain: str, model: type[DomainOptions]) -> str:
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        known = ", ".join(model.model_fields) or "none"
        return f"unknown config key {where}.{key} for domain {domain!r}; its keys: {known}"
    shown = repr(e.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    info = model.model_fields.get(str(e["loc"][0])) if e["loc"] else None
    bound = bounds(info) if info is not None else ""
    if bound and e["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
        return f"config key '{where}.{key}' = {shown} is out of range: use a finite value in {bound}"
    msg = str(e["msg"]).removeprefix("Value error, ")
    return f"config key '{where}.{key}' = {shown}: {msg}" + (f" (bounds: {bound})" if bound else "")


class SourceConfig(TaskConfig):
    """One task source: ``name`` is its domain, the other ``[task]`` keys its options."""

    _where: ClassVar[str] = "sources"

    label: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """The source's name in the ledger, metrics and report (default: the domain's name; two
    sources of one domain need their own labels)."""
    share: float = Field(1.0, gt=0, le=1000)
    """Target share of every step's accepted groups, relative to the other sources' shares."""
    arms: list[ArmName] | None = Field(None, min_length=1)
    """Harness arms of this source (default ``harness.arms``)."""
    max_turns: int | None = Field(None, ge=1, le=1000)
    """Model turns per sequence of this source (default ``harness.max_turns``)."""
    max_tokens_per_turn: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """Output cap of one model turn of this source (default ``harness.max_tokens_per_turn``)."""
    max_context: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """Trajectory budget in tokens of this source (default ``harness.max_context``)."""
    max_obs_chars: int | None = Field(None, ge=1, le=10_000_000)
    """Characters of a tool result shown to the model (default ``harness.max_obs_chars``)."""
    temperature: float | None = Field(None, gt=0, le=10)
    """Sampling temperature of this source (default ``harness.temperature``); its rows carry it, so
    the trainer recomputes their log-probs at it."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus sampling mass of this source (default ``harness.top_p``; 1: off)."""
    top_k: int | None = Field(None, ge=0, le=MAX_TOKENS)
    """Sample among the k most likely tokens in this source (default ``harness.top_k``; 0: off)."""
    render_tools: bool | None = None
    """Render the tool schemas into this source's system prompts (default ``harness.render_tools``)."""
    staleness: int | None = Field(None, ge=1, le=1000)
    """Largest dispatch age (steps) of this source's trained groups (default ``rollout.staleness``;
    seed 001: Code two, Cyber eight)."""
    dispatch_cap: float | None = Field(None, ge=1, le=100)
    """The most groups a step pays for this source, as a multiple of its target (sync: dispatched;
    async: finished before the step stops waiting for it; default ``rollout.sync_dispatch_cap``)."""
    stale_policy: Literal["drop", "reissue"] = "drop"
    """A group past its staleness: 'drop' discards it and its prompt (the public launchers'
    setting); 'reissue' discards its rollouts and dispatches the same task again."""
    heldout_tasks: int | None = Field(None, ge=1, le=MAX_STEPS)
    """Held-out tasks of this source's baseline and final evaluations (default ``eval.heldout_tasks``)."""
    sft_demos: int | None = Field(None, ge=0, le=MAX_STEPS)
    """Expert demonstrations of this source (default: ``sft.demos`` split by share over the
    sources whose domain has a scripted expert)."""
    sft_epochs: int | None = Field(None, ge=0, le=1000)
    """Passes over this source's demonstrations (default ``sft.epochs``): a source whose tasks a
    model must memorise (a code pack) can take many cheap passes over few demonstrations."""
    sft_detour_p: float | None = Field(None, ge=0, lt=1)
    """Probability of a detour before each look-up in this source's demonstrations (default ``sft.detour_p``)."""
    rft_tasks: int | None = Field(None, ge=0, le=MAX_STEPS)
    """Training tasks of this source the model attempts for RFT (default ``rft.tasks``; 0: none)."""
    lr: float | None = Field(None, gt=0, le=1)
    """This source's RL learning rate (default ``rl.lr``): its groups go to mini-batches of their own,
    whose optimizer steps take ``rl.lr``'s schedule scaled by lr / ``rl.lr`` (a lower one where this
    source's updates erase another's; a higher one where it learns slowly). Sources with another
    rate add optimizer steps: each rate's groups are split into up to ``rl.minibatches``."""
    teacher: str | None = None
    """This source's distillation teacher (default ``distill.teacher``; forms as there): its tokens are
    scored by it and their advantages carry the reverse KL (docs/distillation.md)."""
    kl_weight: float | None = Field(None, ge=0, le=1000)
    """Weight of this source's reverse-KL advantage (default ``distill.kl_weight``)."""
    reward_weight: float | None = Field(None, ge=0, le=1000)
    """Weight of this source's group advantage from its reward (default ``rl.reward_weight``)."""
    prefix: Literal["none", "sft", "teacher"] | None = None
    """Where this source's distilled sequences start (default ``distill.prefix``)."""
    group_size: int | None = Field(None, ge=2, le=1024)
    """Sequences per group of this source (default ``rl.group_size``). A group trains only when its
    attempts differ, which a task with pass rate p does with probability 1 − p^G − (1 − p)^G: at
    p = 0.05 that is 0.19 for G = 4 and 0.56 for G = 16, so a source the model rarely solves takes
    larger groups (pass@k-style), as does one it nearly always solves (docs/sources.md)."""
    difficulty_window: int = Field(0, ge=0, le=1000)
    """Online difficulty control: a task whose last this-many groups all passed or all failed is
    skipped when the stream comes back to it (counted as ``difficulty_skipped``; 0: off). Only
    streams that repeat tasks (a pack, a filtered set) come back to a task."""

    @field_validator("teacher")
    @classmethod
    def _teacher(cls, v):
        from rlonce.config.distill import check_teacher

        return check_teacher(v)
