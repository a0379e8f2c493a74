"""general: office tool use through MCP services (mail, calendar, tickets, ledger, documents)."""

from typing import Literal

from pydantic import Field, field_validator

from rlonce.config.domains import DomainOptions, DomainSpec, Probe


class GeneralOptions(DomainOptions):
    rubric_reward: Literal["all", "fraction"] = "all"
    """Reward 1 only when every rubric item passes ('all'), or the share of items passed
    ('fraction'). 'all' by default: a fraction pays for the negative items, which doing nothing passes."""
    general_templates: list[str] = Field([], max_length=8)
    """The task templates drawn, in turn (empty: all eight). The easy tier is the two that use one
    service, ``["balance_question", "resolve_with_comment"]`` (docs/general.md, "Tiers")."""

    @field_validator("general_templates")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        from rlonce.envs.general.tasks import TEMPLATES

        unknown = [n for n in names if n not in TEMPLATES]
        if unknown:
            raise ValueError(f"unknown general template(s) {', '.join(unknown)}; templates: {', '.join(TEMPLATES)}")
        if len(set(names)) != len(names):
            raise ValueError("general_templates names a template twice; list each once")
        return names


def build(o: GeneralOptions):
    from functools import partial

    from rlonce.envs.domains import Domain
    from rlonce.envs.general.env import GeneralEnv
    from rlonce.envs.general.expert import expert_turns
    from rlonce.envs.general.tasks import make_task

    make_task = partial(make_task, templates=tuple(o.general_templates) or None)

    def attach(run_dir, judge_for) -> Domain:
        judge, _ = judge_for("general-judge")
        agreement, _ = judge_for("general-agreement", "agreement_judge") if judge is not None else (None, False)
        env = partial(GeneralEnv, reward=o.rubric_reward, judge=judge, agreement=agreement)
        return Domain("general", env, make_task, expert=expert_turns)

    return Domain("general", partial(GeneralEnv, reward=o.rubric_reward), make_task, expert=expert_turns,
                  attach=attach)


def judge_rules() -> dict:
    """The scripted judge's rule for a ``judged`` rubric item (``rlonce.grading.scripted``): passed
    when the text holds every 'single-quoted' phrase of the criterion."""
    from rlonce.envs.general.judged import KIND, scripted_item

    return {KIND: scripted_item}


DOMAIN = DomainSpec(
    name="general", build=build, options=GeneralOptions, has_expert=True, judge_rules=judge_rules,
    summary="office tasks through MCP services; rubric items checked on the services' state",
    probe=Probe(run="rlonce.envs.general.probe:run_probe", format_report="rlonce.envs.general.probe:format_report",
                reads=("tasks", "routes", "concurrency", "judge")))
