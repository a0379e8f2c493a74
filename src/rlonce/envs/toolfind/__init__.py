"""toolfind: the embedded agentic domain — find a value by looking files up with bash tools."""

from functools import partial

from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec


class ToolfindOptions(DomainOptions):
    two_hop_fraction: float = Field(0.6, ge=0, le=1)
    """Share of questions that need two look-ups."""


def _task(two_hop: float, split: str, index: int):
    from rlonce.envs.domains import RL_TASK_OFFSET, SFT_TASK_OFFSET
    from rlonce.envs.toolfind.tasks import make_task

    if split == "heldout":
        return make_task("heldout", index, two_hop_fraction=two_hop)
    offset = SFT_TASK_OFFSET if split == "sft" else RL_TASK_OFFSET
    return make_task("train", offset + index, two_hop_fraction=two_hop)


def build(options: ToolfindOptions):
    from rlonce.envs.domains import Domain
    from rlonce.envs.toolfind.env import ToolfindEnv
    from rlonce.envs.toolfind.expert import expert_turns

    return Domain("toolfind", ToolfindEnv, partial(_task, options.two_hop_fraction), expert=expert_turns)


def base_corpus():
    """What the embedded model was pre-trained and its tokenizer trained on (``BaseCorpus``)."""
    from rlonce.envs.toolfind import corpus

    return corpus


DOMAIN = DomainSpec(name="toolfind", build=build, options=ToolfindOptions, has_expert=True, base_corpus=base_corpus,
                    summary="find a value in files with bash look-ups (the embedded model's domain)")
