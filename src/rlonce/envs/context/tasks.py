"""Context-following tasks, generated from ``(split, index)``: four families, each answered in one
reply and checked by atomic items (``items``).

- ``rules`` (``rules.py``): formatting rules and a persona in the system prompt (a JSON object
  with given keys, exactly N bullet lines, a word limit, upper case, forbidden words, a required
  opening, a sign-off), notes in the conversation, and a question about one note at the end. In
  half the tasks a rule is changed mid-conversation: the latest rule wins, and a negative item
  fails a reply that obeys the superseded one.
- ``document``: a gazetteer of an alternate world whose facts differ from ours (the capital of
  France is Lyon there); the answer must come from it, cite its passage ``[Pn]``, and not give
  the real-world fact (negative item).
- ``retention``: a conversation quoted in the prompt: a value given in turn 1, a second value in
  turn 3 (another person's, or a correction of the first), small talk after, the question last.
  The reply holds the right value and not the other (negative item).
- ``listing``: a tool's long output (a warehouse listing) earlier in the conversation; the
  answer is one field of one line, and the reply names no other record (negative item).

The public domain interface gives an environment a system prompt and one user message, so the
earlier turns of a conversation (and the tool's output) are quoted in that message, labelled by
speaker; there are no tool arms (``docs/context.md``).

Context length is a tier (``LENGTHS``, characters of system prompt + message): filler — more notes,
passages, small talk, listing lines — is added until the next piece would pass it, and the piece
that holds the answer is put at a random place among them. ``short`` fits the embedded model's
1024 tokens (its tokenizer: 1.25–1.6 characters a token here), ``medium`` SmolLM2's 2048 (1.8–3.8:
the listing's codes are the densest), ``long`` a served model's 8k.

A task is a pure function of ``(split, index)`` and the options; every split draws from its own
seeds (``sha256("context/<split>/<index>")``), so held-out tasks are never the training ones.
"""

from __future__ import annotations

import hashlib
import random

from rlonce.envs.context import vocab as V
from rlonce.envs.context.items import Item
from rlonce.envs.context.record import LENGTHS, ContextTask, conversation, fresh, grow
from rlonce.envs.context.rules import rules_task

FAMILIES = ("rules", "document", "retention", "listing")
PASSAGE_NOTES = {"short": 0, "medium": 1, "long": 6}
"""Tier → filler sentences in each gazetteer passage besides its fact."""
ID_PATTERN = r"\bSH-\d{4}\b"


# -- document ---------------------------------------------------------------------------------

DOCUMENT_SYSTEM = ("You answer questions about the documents the user gives you. Answer from the document, and cite "
                   "the passage you used, like [P2].")


CURRENCY_NAMES = (*sorted(set(V.CURRENCIES.values())), *V.OLD_COINS)


def _fact(kind: str, country: str, value: str) -> str:
    return f"The capital of {country} is {value}." if kind == "capital" else \
        f"The currency of {country} is the {value}."


def _altered(kind: str, country: str, rng: random.Random, used: set[str]) -> str:
    """A value for ``country``'s ``kind`` that is not the real one (nor in ``used``)."""
    if kind == "capital":
        pool = [c for c in V.CAPITALS[country][1] if c not in used]
    else:
        pool = [c for c in CURRENCY_NAMES if c != V.CURRENCIES[country] and c not in used]
    value = rng.choice(pool) if pool else ""
    used.add(value)
    return value


def document_task(rng: random.Random, task_id: str, length: str) -> ContextTask:
    facts = [("capital", c) for c in V.CAPITALS] + [("currency", c) for c in V.CURRENCIES]
    rng.shuffle(facts)
    kind, country = facts.pop()
    used: set[str] = set()
    real = V.CAPITALS[country][0] if kind == "capital" else V.CURRENCIES[country]
    used.add(real)
    answer = _altered(kind, country, rng, used)
    extra = PASSAGE_NOTES[length]

    def passage(fact_kind: str, where: str, value: str) -> str:
        notes = [V.fill(rng.choice(V.PLACE_NOTES), rng, V.PLACE_WORDS, region=rng.choice(V.REGIONS))
                 for _ in range(extra)]
        return " ".join([f"{where}.", _fact(fact_kind, where, value), *notes])

    others: list[tuple[str, str]] = []

    def other() -> str:
        while facts:
            k, c = facts.pop()
            value = _altered(k, c, rng, used)
            if value:
                others.append((k, value))
                return passage(k, c, value)
        return "x" * LENGTHS["long"]  # no fact left: a piece no budget takes

    question = (f"According to the gazetteer, what is the {kind} of {country}? Answer from the gazetteer only, and "
                "cite the passage you used, like [P1].")

    def document(passages: list[str]) -> str:
        return ("The Orvand Gazetteer, an atlas of an alternate world (its facts differ from ours):\n\n"
                + "\n".join(f"[P{i + 1}] {p}" for i, p in enumerate(passages)) + f"\n\nQuestion: {question}")

    key = passage(kind, country, answer)
    body = grow(len(DOCUMENT_SYSTEM) + len(document([key])), LENGTHS[length], other, minimum=2,
                 overhead=len("[P10] \n"))
    del others[len(body):]  # the passage that did not fit
    at = rng.randint(0, len(body))
    body.insert(at, key)
    prompt = document(body)
    cite = f"[P{at + 1}]"
    the = "" if kind == "capital" else "the "
    decoy_pool = ([c for cs in (v[1] for k, v in V.CAPITALS.items() if k != country) for c in cs] if kind == "capital"
                  else CURRENCY_NAMES)
    items = (Item(f"holds the gazetteer's answer {answer}", "holds", {"value": answer}),
             Item(f"cites {cite} and no other passage", "cites", {"passage": at + 1}),
             Item(f"does not give the real-world answer {real} from memory", "lacks", {"values": [real]}, "negative"),
             Item("gives no other passage's value", "lacks", {"values": [v for _, v in others]}, "negative"))
    return ContextTask(task_id, "document", kind, DOCUMENT_SYSTEM, prompt, answer,
                       f"The {kind} of {country} is {the}{{}} {cite}.", f"{{}} {cite}", items, memory=real,
                       distractor=others[min(at, len(others) - 1)][1],
                       decoy=rng.choice([d for d in decoy_pool if d not in used]))


# -- retention --------------------------------------------------------------------------------

RETENTION_SYSTEM = ("You are a helpful assistant. The earlier turns of this conversation are quoted in the user's "
                    "message.")


def retention_task(rng: random.Random, task_id: str, length: str) -> ContextTask:
    attribute = rng.choice(list(V.ATTRIBUTES))
    used: set[str] = set()
    first, third = (fresh(rng, lambda r: V.attribute_value(attribute, r), used) for _ in range(2))
    kind = rng.choice(("other_owner", "correction"))
    turns = [f"[turn 1] user: Please remember my {attribute} for later: it is {first}.",
             f"[turn 2] assistant: Noted: your {attribute} is {first}."]
    if kind == "other_owner":
        owner = rng.choice(V.OWNERS).format(name=V.name(rng))
        turns += [f"[turn 3] user: By the way, {owner}'s {attribute} is {third}; please don't mix them up.",
                  "[turn 4] assistant: Understood, I will keep them apart."]
        answer, distractor = first, third
    else:
        turns += [f"[turn 3] user: Sorry, I gave you the wrong {attribute} earlier: it is {third}, not {first}.",
                  f"[turn 4] assistant: Thanks, I have updated your {attribute} to {third}."]
        answer, distractor = third, first
    question = f"What is my {attribute}?"

    def small_talk() -> str:
        ask, reply = rng.choice(V.SMALL_TALK)
        n = 2 * len(turns) - 3  # turns 1 to 4 are one piece each, later ones a pair
        pair = (f"[turn {n}] user: {V.fill(ask, rng, V.SMALL_TALK_WORDS, name=V.name(rng))}\n\n"
                f"[turn {n + 1}] assistant: {V.fill(reply, rng, V.SMALL_TALK_WORDS, name=V.name(rng))}")
        turns.append(pair)
        return pair

    base = len(RETENTION_SYSTEM) + len(conversation(turns, question))
    grow(base, LENGTHS[length], small_talk, minimum=1, overhead=2)
    turns.pop()  # the piece that did not fit
    items = (Item(f"holds the answer {answer}", "holds", {"value": answer}),
             Item(f"does not give the other value {distractor}", "lacks", {"values": [distractor]}, "negative"))
    return ContextTask(task_id, "retention", kind, RETENTION_SYSTEM, conversation(turns, question), answer,
                       f"Your {attribute} is {{}}.", "{}", items, distractor=distractor,
                       decoy=fresh(rng, lambda r: V.attribute_value(attribute, r), used))


# -- listing ----------------------------------------------------------------------------------

LISTING_SYSTEM = ("You are an operations assistant. Answer from the tool output in the conversation, and name no "
                  "record but the one asked about.")
FIELDS = {"qty": ("How many units does shipment {id} hold?", "Shipment {id} holds {{}} units."),
          "bin": ("Which bin holds shipment {id}?", "Shipment {id} is in bin {{}}."),
          "owner": ("Who owns shipment {id}?", "Shipment {id} belongs to {{}}.")}


def listing_task(rng: random.Random, task_id: str, length: str) -> ContextTask:
    site, field = rng.choice(V.SITES), rng.choice(list(FIELDS))
    used: dict[str, set[str]] = {"id": set(), "qty": set(), "bin": set(), "owner": set()}
    draws = {"id": lambda r: f"SH-{r.randint(1000, 9999)}", "qty": lambda r: str(r.randint(1, 999)),
             "bin": lambda r: f"{r.choice('ABCDEFGHJK')}-{r.randint(1, 99):02d}", "owner": V.name}
    rows: list[dict[str, str]] = []

    def row() -> str:
        rows.append({k: fresh(rng, d, used[k]) for k, d in draws.items()} | {"item": rng.choice(V.ITEMS)})
        return _line(rows[-1])

    header = f"{'ID':<9}{'ITEM':<14}{'QTY':>4}  {'BIN':<6}OWNER"
    tool = f'assistant called the tool: warehouse_ls(site="{site}")'
    ask, sentence = FIELDS[field]
    first = row()
    question = ask.format(id=rows[0]["id"])
    base = len(LISTING_SYSTEM) + len(conversation([f"user: What is in the {site} warehouse?", tool,
                                                    f"tool result:\n{header}\n"], question)) + len(first)
    grow(base, LENGTHS[length], row, minimum=4)
    rows.pop()  # the line that did not fit
    asked = rows.pop(0)
    at = rng.randint(0, len(rows))
    rows.insert(at, asked)
    listing = "\n".join(_line(r) for r in rows)
    turns = [f"user: What is in the {site} warehouse?", tool, f"tool result:\n{header}\n{listing}"]
    neighbour = rows[at - 1 if at else at + 1]
    items = (Item(f"holds the answer {asked[field]}", "holds", {"value": asked[field]}),
             Item(f"names no shipment but {asked['id']}", "only_ids", {"pattern": ID_PATTERN, "allowed": [asked["id"]]},
                  "negative"),
             Item(f"gives no other line's {field}", "lacks", {"values": [r[field] for r in rows if r is not asked]},
                  "negative"))
    return ContextTask(task_id, "listing", field, LISTING_SYSTEM, conversation(turns, question), asked[field],
                       sentence.format(id=asked["id"]), f"{asked['id']}: {{}}", items,
                       distractor=neighbour[field], decoy=fresh(rng, draws[field], used[field]))


def _line(r: dict[str, str]) -> str:
    return f"{r['id']:<9}{r['item']:<14}{r['qty']:>4}  {r['bin']:<6}{r['owner']}"


BUILDERS = {"rules": rules_task, "document": document_task, "retention": retention_task, "listing": listing_task}


def make_task(split: str, index: int, families: tuple[str, ...] = FAMILIES, length: str = "short") -> ContextTask:
    """Task ``index`` of ``split``: the families take turns; its own seed per split and index."""
    family = families[index % len(families)]
    rng = random.Random(hashlib.sha256(f"context/{split}/{index}".encode()).digest())
    return BUILDERS[family](rng, f"context-{split}-{index}", length)
