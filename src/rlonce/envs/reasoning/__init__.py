"""reasoning: rule-verified reasoning-gym tasks, answered in one reply (harness arm ``single-turn``)."""

from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec, PackTools, need_module


class ReasoningOptions(DomainOptions):
    datasets: list[str] = Field(["chain_sum"], min_length=1)
    """reasoning-gym dataset names; tasks take turns over them."""
    options: dict[str, dict] = {}
    """Per-dataset generator options, e.g. ``{chain_sum = {max_terms = 2}}``."""
    format_weight: float = Field(0.1, ge=0, le=1)
    """Reward added when the final answer is inside <answer></answer> (M1's format reward)."""
    system_prompt: str | None = None
    """The system prompt (default: ``rlonce.envs.reasoning.env.SYSTEM_PROMPT``)."""
    pack: str | None = None
    """A ``rlonce tasks filter`` folder; training then draws only the tasks it kept."""


def build(o: ReasoningOptions):
    from functools import partial

    from rlonce.envs.domains import Domain
    from rlonce.envs.packs import read_pack
    from rlonce.envs.reasoning.env import SYSTEM_PROMPT, ReasoningEnv
    from rlonce.envs.reasoning.expert import expert_turns
    from rlonce.envs.reasoning.tasks import make_task
    from rlonce.errors import PackError

    datasets, options = list(o.datasets), dict(o.options)
    kept = None
    if o.pack:
        pack = read_pack(o.pack)
        drawn = pack.get("task_options", pack)  # (packs filtered before task_options kept them at the top)
        if drawn.get("datasets") != datasets or drawn.get("options") != options:
            raise PackError(f"the pack {o.pack} was filtered from datasets {drawn.get('datasets')} with options "
                            f"{drawn.get('options')}, not the configured {datasets} {options}; filter again or fix "
                            "the source's datasets/options")
        kept = list(pack["kept"])
    env = partial(ReasoningEnv, format_weight=o.format_weight, system_prompt=o.system_prompt or SYSTEM_PROMPT)
    return Domain("reasoning", env, lambda split, i: make_task(split, i, datasets, options), kept=kept,
                  single_turn=True, expert=expert_turns)


DOMAIN = DomainSpec(name="reasoning", build=build, options=ReasoningOptions, has_expert=True, single_turn=True,
                    tools=False, summary="reasoning-gym tasks, one reply, checked by the dataset's own verifier",
                    needs=lambda o: [need_module("reasoning-gym", "reasoning_gym", "the reasoning domain's tasks")],
                    packs=PackTools(filter=True))
