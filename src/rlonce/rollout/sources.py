"""A run's task sources, resolved and built: each a domain, its harness arms and the limits the
runtime keeps for it (``[[sources]]`` in the config, ``rlonce.config.sources``).

``plan_sources`` fills every default from the run's other tables (a run without ``[[sources]]``
is one source, ``[task]``); ``check_sources`` refuses a plan a domain cannot run (arms, SFT);
``build_sources`` builds each domain and its rollout spec; ``SourceExecutor`` runs a group on
its own source's executor. The orchestrator sees sources only by label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlonce.config import ConfigError, RunConfig, TaskConfig
from rlonce.config.distill import is_endpoint
from rlonce.config.domains import domain_names, load_domain
from rlonce.config.sections import MAX_STEPS
from rlonce.config.sources import SourceConfig
from rlonce.envs.base import JudgeBinding
from rlonce.envs.domains import Domain, domain_for
from rlonce.rollout.runner import RolloutSpec


@dataclass(frozen=True, kw_only=True)
class SourcePlan:
    """A source with every default resolved from the run's config."""

    label: str
    options: TaskConfig
    """The domain (``options.name``) and its options: what ``rlonce.envs.domains`` builds from."""
    share: float
    """Normalised: the shares of a run sum to 1."""
    arms: tuple[str, ...]
    max_turns: int
    max_tokens_per_turn: int
    max_context: int
    max_obs_chars: int
    staleness: int
    stale_policy: str
    heldout_tasks: int
    during_tasks: int
    sft_demos: int
    sft_epochs: int
    sft_detour_p: float
    rft_tasks: int
    """Training tasks the model attempts for RFT (``rlonce.recipes.rft``; 0: none)."""
    difficulty_window: int
    dispatch_cap: float
    group_size: int
    """Sequences per group (``[[sources]]``, else ``rl.group_size``)."""
    temperature: float
    """Sampling of the source's turns (``[[sources]]``, else ``[harness]``): rows carry the
    temperature, and candidate-set sizes carry what top-p and top-k cut."""
    top_p: float
    top_k: int
    render_tools: bool
    lr_scale: float = 1.0
    """This source's learning rate over ``rl.lr`` (``[[sources]] lr``): its rows carry it and the
    trainer's mini-batches keep each scale apart (``rlonce.train.minibatch.scaled_splits``)."""
    teacher: str | None = None
    """The distillation teacher (``[[sources]]``, else ``distill.teacher``; None: no distillation)."""
    kl_weight: float = 0.0
    """Weight of the reverse-KL advantage (0 without a teacher)."""
    reward_weight: float = 1.0
    """Weight of the group advantage from the reward."""
    prefix: str = "none"
    """Where a distilled sequence starts ('none', 'sft', 'teacher'; ``distill.prefix``)."""
    student_turns: int = 0
    """Turns the student samples after a prefix (0: the rest of the episode)."""

    @property
    def distills(self) -> bool:
        return self.teacher is not None


def plan_sources(cfg: RunConfig) -> list[SourcePlan]:
    """The run's sources, resolved (a run without ``[[sources]]``: one source from ``[task]``,
    labelled with its domain's name, with all of ``sft.demos``). A mixed run splits ``sft.demos``
    by share over the sources with a scripted expert that set no ``sft_demos`` of their own."""
    r, h = cfg.rollout, cfg.harness
    staleness = r.staleness or (1 if r.mode == "sync" else 2)
    given = cfg.sources or [SourceConfig(**cfg.task.model_dump())]
    total = sum(s.share for s in given)
    experts = [i for i, s in enumerate(given) if s.sft_demos is None and load_domain(s.name).has_expert]
    expert_share = sum(given[i].share for i in experts) or 1.0
    plans = []
    for i, s in enumerate(given):
        demos = s.sft_demos
        if not cfg.sources:  # the one-source run: ``sft.demos`` is its own
            demos = cfg.sft.demos
        elif demos is None:
            demos = round(cfg.sft.demos * s.share / expert_share) if i in experts else 0
        plans.append(SourcePlan(
            label=s.source_label, options=TaskConfig(name=s.name, **s.domain_options().model_dump()),
            share=s.share / total, arms=tuple(s.arms or cfg.harness.arms), max_turns=s.max_turns or h.max_turns,
            max_tokens_per_turn=s.max_tokens_per_turn or h.max_tokens_per_turn,
            max_context=s.max_context or h.max_context, max_obs_chars=s.max_obs_chars or h.max_obs_chars,
            staleness=s.staleness or staleness, stale_policy=s.stale_policy,
            heldout_tasks=s.heldout_tasks or cfg.eval.heldout_tasks,
            during_tasks=min(cfg.eval.during_tasks, s.heldout_tasks or MAX_STEPS), sft_demos=demos,
            sft_epochs=cfg.sft.epochs if s.sft_epochs is None else s.sft_epochs,
            sft_detour_p=cfg.sft.detour_p if s.sft_detour_p is None else s.sft_detour_p,
            rft_tasks=cfg.rft.tasks if s.rft_tasks is None else s.rft_tasks,
            difficulty_window=s.difficulty_window, dispatch_cap=s.dispatch_cap or r.sync_dispatch_cap,
            group_size=s.group_size or cfg.rl.group_size,
            temperature=h.temperature if s.temperature is None else s.temperature,
            top_p=h.top_p if s.top_p is None else s.top_p, top_k=h.top_k if s.top_k is None else s.top_k,
            render_tools=h.render_tools if s.render_tools is None else s.render_tools,
            lr_scale=1.0 if s.lr is None else s.lr / cfg.rl.lr, **_distill_plan(cfg, s)))
    return plans


def _distill_plan(cfg: RunConfig, s: SourceConfig) -> dict:
    """A source's distillation settings, each resolved once: its own, else ``[distill]``'s."""
    d = cfg.distill
    teacher = s.teacher or d.teacher
    reward = cfg.rl.reward_weight if s.reward_weight is None else s.reward_weight
    if teacher is None:
        return {"reward_weight": reward}
    prefix = s.prefix or d.prefix
    turns = d.student_turns if d.student_turns is not None else (0 if prefix == "none" else 1)
    return {"teacher": teacher, "kl_weight": d.kl_weight if s.kl_weight is None else s.kl_weight,
            "reward_weight": reward, "prefix": prefix, "student_turns": turns}


def check_sources(cfg: RunConfig) -> list[SourcePlan]:
    """The run's plan, refused with a one-line fix when a domain cannot run it: a single-turn
    domain takes only the ``single-turn`` arm, a tool domain never takes it, SFT needs a scripted
    expert; or when its teacher cannot serve it (``endpoint_refusal``)."""
    plans = plan_sources(cfg)
    where = (lambda p: f"[[sources]] {p.label!r}") if cfg.sources else (lambda p: f"task {p.label!r}")
    arms_key = "arms" if cfg.sources else "harness.arms"
    for p in plans:
        entry = load_domain(p.options.name)
        if not entry.tools and p.arms != ("single-turn",):
            raise ConfigError(f"{where(p)} is single-turn: set {arms_key} = [\"single-turn\"]")
        if not entry.single_turn and "single-turn" in p.arms:
            raise ConfigError(f"{where(p)} needs tools: harness arm 'single-turn' is for single-turn tasks "
                              f"({', '.join(n for n in domain_names() if load_domain(n).single_turn)})")
        if not entry.has_expert and p.sft_demos > 0 and p.sft_epochs > 0:
            fix = "sft_demos = 0 in its table" if cfg.sources else "sft.demos = 0"
            raise ConfigError(f"{where(p)} has no scripted expert for SFT: set {fix}")
        if p.distills and p.prefix == "sft" and not entry.has_expert:
            raise ConfigError(f"{where(p)} has no scripted expert to take SFT prefixes from: use prefix 'teacher' "
                              "or 'none'")
        if p.distills and is_endpoint(p.teacher) and (why := endpoint_refusal(p, bool(cfg.sources))):
            raise ConfigError(f"{where(p)} has an endpoint teacher ({p.teacher}): {why}")
        if not p.distills and p.reward_weight != 1.0:
            raise ConfigError(f"{where(p)} has reward_weight {p.reward_weight} but no teacher: the reward weight "
                              "only scales the reward beside a distillation term; set a teacher or leave it 1")
    topk = cfg.distill.topk > 0 and cfg.distill.topk_weight > 0
    if any(p.distills and p.reward_weight == 0 and p.kl_weight == 0 and not topk for p in plans):
        raise ConfigError("a distilled source with kl_weight 0 and reward_weight 0 trains on nothing: raise one "
                          "(or set distill.topk)")
    return plans


def endpoint_refusal(p: SourcePlan, own_table: bool) -> str | None:
    """Why source ``p`` cannot distil from an endpoint teacher, with what to set (None: it can). The
    endpoint returns raw log-probs over the whole vocabulary at temperature 1 — not at the row's
    temperature, not over a top-p/top-k candidate set — and it only scores: it samples no prefix."""
    def key(name: str) -> str:
        return f"{name} in its table" if own_table else f"harness.{name}"

    if p.temperature != 1.0:
        return (f"it returns log-probs at temperature 1, the source samples at {p.temperature:g}; "
                f"set {key('temperature')} = 1.0")
    if p.top_p < 1.0:
        return (f"it returns log-probs over the whole vocabulary, the source samples top_p {p.top_p:g}; "
                f"set {key('top_p')} = 1.0")
    if p.top_k > 0:
        return (f"it returns log-probs over the whole vocabulary, the source samples top_k {p.top_k}; "
                f"set {key('top_k')} = 0")
    if p.prefix == "teacher":
        return (f"an endpoint only scores, it samples no teacher rollouts for prefixes; set "
                f"{'prefix in its table' if own_table else 'distill.prefix'} to 'none' or 'sft'")
    return None


@dataclass
class Source:
    """A built source: its plan, its domain (named by the source's label) and its rollout spec."""

    plan: SourcePlan
    domain: Domain
    spec: RolloutSpec


def judge_maker(grading, run_dir: Path | None) -> Callable[..., tuple[JudgeBinding | None, bool]]:
    """``(name, which="judge")`` → (the judge ``grading.<which>`` describes, recording to
    ``RUN/grading/<name>.jsonl``, or None; whether it is vision-capable), for domains that grade
    with a judge of their own."""
    def make(name: str, which: str = "judge"):
        cfg = getattr(grading, which) if grading is not None else None
        if cfg is None or cfg.kind == "none":
            return None, False
        from rlonce.grading.build import build_judge

        record = run_dir / "grading" / f"{name}.jsonl" if run_dir else None
        return build_judge(cfg, record, name=name), cfg.vision
    return make


def build_sources(plans: list[SourcePlan], spec: RolloutSpec, *, run_dir: Path | None = None,
                  grading=None) -> dict[str, Source]:
    """Each plan's domain and rollout spec (``spec`` with the source's arms, sampling, tool rendering
    and its turn, token, context and observation budgets), by label. ``run_dir`` and ``grading``
    (the ``[grading]`` config) reach domains that need them (``Domain.attach``)."""
    out = {}
    for p in plans:
        domain = domain_for(p.options)
        if domain.attach is not None:
            domain = domain.attach(run_dir, judge_maker(grading, run_dir))
        domain = dataclasses.replace(domain, name=p.label)
        limits = dataclasses.replace(spec.limits, max_turns=p.max_turns, max_obs_chars=p.max_obs_chars,
                                     render_tools=p.render_tools)
        sampling = dataclasses.replace(spec.sampling, max_tokens=p.max_tokens_per_turn, temperature=p.temperature,
                                       top_p=p.top_p, top_k=p.top_k)
        out[p.label] = Source(p, domain, dataclasses.replace(spec, arms=p.arms, limits=limits, sampling=sampling,
                                                             max_context=p.max_context))
    return out


class SourceExecutor:
    """The orchestrator's executor over several sources: a group runs on its source's executor."""

    def __init__(self, executors: dict):
        self.executors = executors

    async def run_group(self, group, group_size: int):
        return await self.executors[group.source].run_group(group, group_size)

    def reserve(self, group, group_size: int) -> None:
        if hasattr(self.executors[group.source], "reserve"):
            self.executors[group.source].reserve(group, group_size)

