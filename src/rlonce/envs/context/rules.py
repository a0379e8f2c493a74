"""The rules family: formatting rules and a persona stated in the system prompt, notes in the
conversation, a question about one note at the end.

A task's rules are one of ``STATIC`` (combinations one reply can obey at once: a JSON object with
given keys, exactly N bullet lines, a word limit, upper case, forbidden words, a required opening, a
sign-off), or, in half the tasks, one rule changed mid-conversation (``CHANGES``: the opening, the
sign-off, the case, JSON ↔ bullets). The latest rule wins: a negative item fails a reply that
obeys the superseded one (``superseded_item``), and another fails a reply naming any other note's
value.
"""

from __future__ import annotations

import random

from rlonce.envs.context import vocab as V
from rlonce.envs.context.items import Item, norm
from rlonce.envs.context.record import LENGTHS, ContextTask, Rule, conversation, fresh, grow

STATIC = (("json",), ("bullets",), ("bullets", "upper"), ("max_words",), ("max_words", "upper"),
          ("max_words", "forbid"), ("max_words", "prefix"), ("max_words", "signoff"), ("upper",), ("forbid",),
          ("prefix",), ("signoff",))
"""Rule sets of the tasks whose rules stay: the combinations one reply can obey at once."""
CHANGES = ("prefix", "signoff", "case", "format")


def _rule(kind: str, rng: random.Random, who: dict) -> Rule:
    key = V.ATTRIBUTES[who["attribute"]][0]
    if kind == "json":
        return Rule("json", f'Reply with a JSON object only, with exactly the keys "name" and "{key}".',
                    ("name", who["name"], key))
    if kind == "bullets":
        n = rng.randint(2, 4)
        lines = (f"Name: {who['name']}", f"{who['attribute'].capitalize()}: {{}}", "Source: the notes above",
                 "Status: on record")[:n]
        return Rule("bullets", f'Reply as exactly {n} bullet lines, each starting with "- ", and nothing else.', lines)
    if kind == "max_words":
        n = rng.randint(8, 10)
        return Rule("max_words", f"Use at most {n} words.", n)
    if kind in ("upper", "lower"):
        return Rule(kind, f"Write in {'UPPER' if kind == 'upper' else 'lower'} case only.")
    if kind == "forbid":
        words = (V.ATTRIBUTES[who["attribute"]][1], rng.choice(V.EXTRA_FORBIDDEN))
        return Rule("forbid", f'Never use the words "{words[0]}" or "{words[1]}".', words)
    if kind == "prefix":
        return Rule("prefix", f'Begin every reply with "{who["prefix"]}".', who["prefix"])
    return Rule("signoff", f'End every reply with the sign-off "{who["signoff"]}".', who["signoff"])


def rule_items(rule: Rule, answer: str) -> list[Item]:
    """The items that check ``rule``; the first is its main check."""
    k, a = rule.kind, rule.arg
    if k == "json":
        return [Item(f'a JSON object with exactly the keys "{a[0]}" and "{a[2]}"', "json_keys", {"keys": [a[0], a[2]]}),
                Item(f'its "{a[2]}" is {answer}', "json_value", {"key": a[2], "value": answer})]
    if k == "bullets":
        return [Item(f"exactly {len(a)} bullet lines", "bullets", {"n": len(a)})]
    if k == "max_words":
        return [Item(f"at most {a} words", "max_words", {"n": a})]
    if k in ("upper", "lower"):
        return [Item(f"{k} case only", k)]
    if k == "forbid":
        return [Item(f"never the words {' or '.join(repr(w) for w in a)}", "no_words", {"words": list(a)})]
    if k == "prefix":
        return [Item(f"begins with {a!r}", "starts_with", {"text": a})]
    return [Item(f"ends with {a!r}", "ends_with", {"text": a})]


def superseded_item(first: Rule) -> Item:
    """The negative item of a changed rule: the reply does not follow the rule that was replaced."""
    if first.kind in ("prefix", "signoff"):
        return Item(f"does not use the superseded {first.kind} {first.arg!r}", "lacks", {"values": [first.arg]},
                    "negative")
    main = rule_items(first, "")[0]
    return Item(f"does not follow the superseded rule ({main.name})", "negated",
                {"check": main.check, "args": main.args}, "negative")


def _change(rng: random.Random, who: dict) -> tuple[Rule, Rule, str]:
    """A changed rule: (the first, the latest, what the user says to change it)."""
    kind = rng.choice(CHANGES)
    if kind in ("prefix", "signoff"):
        while True:
            a, b = (rng.choice(V.PREFIXES) if kind == "prefix"
                    else rng.choice(V.SIGNOFFS).format(persona=who["persona"], desk=who["desk"]) for _ in range(2))
            if norm(a) not in norm(b) and norm(b) not in norm(a):
                break
        first, latest = _rule(kind, rng, {**who, kind: a}), _rule(kind, rng, {**who, kind: b})
        verb = "begin" if kind == "prefix" else "end"
        return first, latest, f'From now on, {verb} every reply with "{b}" instead of "{a}".'
    if kind == "case":
        a, b = rng.sample(("upper", "lower"), 2)
        return (_rule(a, rng, who), _rule(b, rng, who),
                f"From now on, write in {'UPPER' if b == 'upper' else 'lower'} case only, not in "
                f"{'UPPER' if a == 'upper' else 'lower'} case.")
    a, b = rng.sample(("json", "bullets"), 2)
    first, latest = _rule(a, rng, who), _rule(b, rng, who)
    if b == "bullets":
        return first, latest, (f'From now on, reply as exactly {len(latest.arg)} bullet lines starting with "- " '
                               "instead of a JSON object.")
    return first, latest, (f'From now on, reply with a JSON object only, with exactly the keys "name" and '
                           f'"{latest.arg[2]}", instead of bullet lines.')


def rules_task(rng: random.Random, task_id: str, length: str) -> ContextTask:
    attribute = rng.choice(list(V.ATTRIBUTES))
    persona, desk = V.name(rng), rng.choice(V.DESKS)
    used: set[str] = set()
    answer = fresh(rng, lambda r: V.attribute_value(attribute, r), used)
    taken = {persona}
    who = {"attribute": attribute, "persona": persona, "desk": desk, "name": V.names(rng, 1, taken)[0],
           "prefix": rng.choice(V.PREFIXES),
           "signoff": rng.choice(V.SIGNOFFS).format(persona=persona, desk=desk)}
    taken.add(who["name"])
    if rng.random() < 0.5:
        first, latest, said = _change(rng, who)
        rules, first_rules = (latest,), (first,)
        kind = f"change_{first.kind}_to_{latest.kind}" if first.kind != latest.kind else f"change_{first.kind}"
    else:
        kinds = rng.choice(STATIC)
        rules, first_rules, said = tuple(_rule(k, rng, who) for k in kinds), (), ""
        kind = "+".join(kinds)
    stated = first_rules or rules
    system = (f"You are {persona}, the assistant of the {desk}. Follow these rules in every reply until the user "
              "changes them:\n" + "\n".join(f"- {r.text}" for r in stated))
    question = f"What is {who['name']}'s {attribute}?"
    key_note = f"- {who['name']}'s {attribute} is {answer}."
    values: list[str] = []

    def note() -> str:
        other = V.names(rng, 1, taken)[0]
        taken.add(other)
        values.append(fresh(rng, lambda r: V.attribute_value(attribute, r), used))
        return f"- {other}'s {attribute} is {values[-1]}."

    skeleton = conversation([f"user: Here are today's notes.\n{key_note}", "assistant: Noted.",
                              *([f"user: {said}", "assistant: Understood."] if said else []),
                              "user: A few more notes.\n", "assistant: Noted."], question)
    notes = grow(len(system) + len(skeleton), LENGTHS[length], note, minimum=2)
    del values[len(notes):]  # the note that did not fit
    at = rng.randint(0, len(notes))
    notes.insert(at, key_note)
    cut = rng.randint(1, len(notes) - 1)
    turns = ["user: Here are today's notes.\n" + "\n".join(notes[:cut]), "assistant: Noted."]
    turns += [f"user: {said}", "assistant: Understood."] if said else []
    turns += ["user: A few more notes.\n" + "\n".join(notes[cut:]), "assistant: Noted."]
    neighbour = values[min(at, len(values) - 1)]
    content = [] if any(r.kind == "json" for r in rules) else [Item(f"holds the answer {answer}", "holds",
                                                                    {"value": answer})]
    items = [*content, *(i for r in rules for i in rule_items(r, answer)),
             *(superseded_item(f) for f in first_rules),
             Item("names no other note's value", "lacks", {"values": values}, "negative")]
    return ContextTask(task_id, "rules", kind, system, conversation(turns, question), answer,
                       f"{who['name']}'s {attribute} is {{}}.", f"{who['name']}: {{}}.", tuple(items), rules,
                       first_rules, distractor=neighbour,
                       decoy=fresh(rng, lambda r: V.attribute_value(attribute, r), used))
