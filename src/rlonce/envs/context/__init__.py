"""context: following the context — rules stated early and changed late, an altered-facts document
with citations, a value kept across a conversation, one line of a tool's long output. Answered in one
reply, graded by atomic items (docs/context.md).

Built on the public domain-plugin interface only (``DomainSpec``, ``Domain``, ``Probe``, the
environment protocol): it imports nothing from another domain, and the registry's ``BUILTIN``
entry is the only place outside this folder that names it.
"""

from typing import Literal

from pydantic import Field

from rlonce.config.domains import DomainOptions, DomainSpec, Probe

Family = Literal["rules", "document", "retention", "listing"]


class ContextOptions(DomainOptions):
    context_families: list[Family] = Field(["rules", "document", "retention", "listing"], min_length=1)
    """The task families; tasks take turns over them (docs/context.md)."""
    context_length: Literal["short", "medium", "long"] = "short"
    """The context's size, filled up to with distractor text: 'short' (at most 1,000 characters of
    system prompt and message) fits the embedded model's 1024 tokens, 'medium' (3,200) SmolLM2's
    2048, 'long' (12,000) a served model's 8k."""
    context_reward: Literal["all", "mean"] = "all"
    """Reward 1 only when every item passes ('all'), or the share of items passed ('mean').
    'all' by default: a share pays for the negative items, which an empty reply passes."""


def build(o: ContextOptions):
    from functools import partial

    from rlonce.envs.context.env import ContextEnv
    from rlonce.envs.context.expert import expert_turns
    from rlonce.envs.context.tasks import make_task
    from rlonce.envs.domains import Domain

    families, length = tuple(o.context_families), o.context_length
    return Domain("context", partial(ContextEnv, reward=o.context_reward),
                  lambda split, i: make_task(split, i, families, length), single_turn=True, expert=expert_turns)


DOMAIN = DomainSpec(
    name="context", build=build, options=ContextOptions, has_expert=True, single_turn=True, tools=False,
    summary="context following: early rules, altered-facts documents, multi-turn values, tool listings; atomic items",
    probe=Probe(run="rlonce.envs.context.probe:run_probe", format_report="rlonce.envs.context.probe:format_report",
                reads=("tasks", "routes")))
