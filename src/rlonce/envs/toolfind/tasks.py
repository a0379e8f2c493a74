"""Toolfind: procedurally generated multi-turn look-up tasks for the embedded agent.

A task is a small tree of text files under ``docs/`` holding ``entity.relation = value``
facts, and a question whose answer needs one or two look-ups ("hops"). The agent must use
its bash tool inside the sandbox to find the facts, then submit the final value. Every word
that the agent has to copy from the question or from an observation is one word of a fixed
vocabulary, so a few-M-parameter model can learn the copying on CPU.

Tasks are data: frozen, picklable, fully determined by ``(split, index)``. The train and
held-out splits draw from disjoint seed ranges.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

ENTITIES = (
    "falcon otter badger heron lynx walrus panda bison cobra eagle ferret gecko hyena ibis "
    "jackal koala lemur marmot newt ocelot parrot quail raven salmon tapir urchin viper weasel "
    "yak zebra beaver camel dingo egret finch gopher hornet iguana jaguar kiwi llama moose "
    "narwhal oriole puma robin skunk toucan vulture wombat alpaca bobcat cricket dove"
).split()
LINKS = ("owner", "friend", "boss")
ATTRIBUTES = ("color", "city", "food", "tool", "metal", "gem")
VALUES = {
    "color": "red blue green amber violet teal crimson ivory olive coral indigo silver".split(),
    "city": "oslo lima cairo paris tokyo quito dakar riga sofia perth delhi kyiv".split(),
    "food": "rice bread pasta soup curry salad tofu bagel pizza noodle taco honey".split(),
    "tool": "hammer wrench saw drill chisel shovel pliers rake axe spade ladder anvil".split(),
    "metal": "iron copper zinc tin nickel cobalt lead gold platinum bronze steel chrome".split(),
    "gem": "ruby opal jade pearl topaz garnet onyx beryl agate quartz amethyst emerald".split(),
}
FILE_NAMES = "alpha beta gamma delta omega sigma kappa lambda theta zeta notes index".split()

FILES_PER_TASK = 5
SPLIT_SEED_BASE = {"train": 0, "heldout": 1_000_000_007}


@dataclass(frozen=True)
class ToolfindTask:
    task_id: str
    question: str
    answer: str
    files: tuple[tuple[str, str], ...]
    """(relative path, content) pairs laid into the workspace."""
    chain: tuple[tuple[str, str], ...]
    """The look-ups an expert performs: (fact key, value found), in order."""
    source: str = "toolfind"
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def hops(self) -> int:
        return len(self.chain)


def make_task(split: str, index: int, *, two_hop_fraction: float = 0.6) -> ToolfindTask:
    """Build task ``index`` of ``split`` ("train" or "heldout") deterministically."""
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLIT_SEED_BASE)}")
    rng = random.Random(SPLIT_SEED_BASE[split] + index * 7919)
    facts = _facts(rng)
    question, chain = _question(rng, facts, two_hop=rng.random() < two_hop_fraction)
    return ToolfindTask(
        task_id=f"toolfind/{split}/{index}",
        question=question,
        answer=chain[-1][1],
        files=_files(rng, facts, chain),
        chain=chain,
    )


def _facts(rng: random.Random) -> dict[str, str]:
    """Six entities, each with two links to another of them and three attribute values."""
    entities = rng.sample(ENTITIES, 6)
    facts: dict[str, str] = {}
    for ent in entities:
        for rel in rng.sample(LINKS, 2):
            facts[f"{ent}.{rel}"] = rng.choice([e for e in entities if e != ent])
        for attr in rng.sample(ATTRIBUTES, 3):
            facts[f"{ent}.{attr}"] = rng.choice(VALUES[attr])
    return facts


def _question(rng: random.Random, facts: dict[str, str], *, two_hop: bool) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The question and its look-up chain: an attribute of an entity, or of the entity a link
    leads to (redrawn until the linked entity has an attribute)."""
    if not two_hop:
        key = rng.choice([k for k in facts if k.split(".")[1] in ATTRIBUTES])
        ent, attr = key.split(".")
        return f"What is the {attr} of {ent}?", ((key, facts[key]),)
    link_keys = [k for k in facts if k.split(".")[1] in LINKS]
    while True:
        first = rng.choice(link_keys)
        mid = facts[first]
        attrs = [k for k in facts if k.startswith(mid + ".") and k.split(".")[1] in ATTRIBUTES]
        if attrs:
            break
    second = rng.choice(attrs)
    ent, rel = first.split(".")
    attr = second.split(".")[1]
    return f"What is the {attr} of the {rel} of {ent}?", ((first, mid), (second, facts[second]))


def _files(rng: random.Random, facts: dict[str, str],
           chain: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The facts shuffled over ``FILES_PER_TASK`` files under docs/, the two facts of a two-hop
    chain in different files."""
    names = rng.sample(FILE_NAMES, FILES_PER_TASK)
    buckets: dict[str, list[str]] = {n: [] for n in names}
    keys = list(facts)
    rng.shuffle(keys)
    for i, key in enumerate(keys):
        buckets[names[i % len(names)]].append(f"{key} = {facts[key]}")
    if len(chain) == 2:  # spread the two facts over different files
        f0 = next(n for n in names if f"{chain[0][0]} = {chain[0][1]}" in buckets[n])
        f1 = next(n for n in names if f"{chain[1][0]} = {chain[1][1]}" in buckets[n])
        if f0 == f1:
            other = next(n for n in names if n != f0)
            line = f"{chain[1][0]} = {chain[1][1]}"
            buckets[f0].remove(line)
            swap = buckets[other].pop()
            buckets[other].append(line)
            buckets[f0].append(swap)
    return tuple(
        (f"docs/{n}.txt", "\n".join(sorted(lines, key=lambda _: rng.random())) + "\n")
        for n, lines in sorted(buckets.items())
    )


def make_tasks(split: str, start: int, count: int, **kw) -> list[ToolfindTask]:
    return [make_task(split, i, **kw) for i in range(start, start + count)]
