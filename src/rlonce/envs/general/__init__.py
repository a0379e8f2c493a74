"""general: office tool use through MCP services (mail, calendar, tickets, ledger, documents)."""

from typing import Literal

from rlonce.config.domains import DomainOptions, DomainSpec, Probe


class GeneralOptions(DomainOptions):
    rubric_reward: Literal["all", "fraction"] = "all"
    """Reward 1 only when every rubric item passes ('all'), or the share of items passed
    ('fraction'). 'all' by default: a fraction pays for the negative items, which doing nothing passes."""


def build(o: GeneralOptions):
    from functools import partial

    from rlonce.envs.domains import Domain
    from rlonce.envs.general.env import GeneralEnv
    from rlonce.envs.general.expert import expert_turns
    from rlonce.envs.general.tasks import make_task

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
