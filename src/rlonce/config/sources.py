"""Task sources: what one RL run trains on, as a mixture (seed 001: "A prompt is sampled from the
union of task datasets. Its group of rollouts is compared within that task").

A ``[[sources]]`` table names a domain with its options (the keys of ``[task]``) and what the
runtime owes it: a share of every step's accepted batch, harness arms, a staleness limit and
what happens to a group that exceeds it, a held-out evaluation size, SFT demonstrations and an
online difficulty filter. A run without ``[[sources]]`` is the one-source run ``[task]``
describes. ``rlonce.rollout.sources.plan_sources`` resolves either with every default filled in
from the run's other tables.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlonce.config.sections import MAX_STEPS, MAX_TOKENS, ArmName, TaskConfig


class SourceConfig(TaskConfig):
    """One task source: ``name`` is its domain, the other ``[task]`` keys its options."""

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
    difficulty_window: int = Field(0, ge=0, le=1000)
    """Online difficulty control: a task whose last this-many groups all passed or all failed is
    skipped when the stream comes back to it (counted as ``difficulty_skipped``; 0: off). Only
    streams that repeat tasks (a pack, a filtered set) come back to a task."""
