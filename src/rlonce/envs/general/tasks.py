"""General tool-use tasks: eight templates over a seeded office (``world.World``), single- and
multi-service, each with its rubric items and the reference plan the scripted expert follows.

Task ``i`` of a split uses template ``i % 8`` (of the chosen ones: ``general_templates``) on the
world of a seed drawn from (split, i); the held-out split draws from other seeds, so no held-out
world is trained on. A task is plain data: its seed, template, prompt, services, items and plan;
the environment rebuilds the state.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from rlonce.envs.general.rubric import Item
from rlonce.envs.general.world import ME, TODAY, World


@dataclass(frozen=True)
class GeneralTask:
    task_id: str
    seed: int
    template: str
    prompt: str
    services: tuple[str, ...]
    items: tuple[Item, ...]
    plan: tuple[tuple[str, dict], ...] = ()
    """The reference solution: agent-facing tool calls (``service__tool``), then the answer."""
    answer: str = ""
    split: str = "train"
    extra: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return "general"


def _cents(amount: str) -> int:
    # the ledger service's own parser (services/ledger_svc.py) runs in the service sandbox and imports
    # nothing from rlonce, so the expected value is computed here by the same rule
    whole, _, frac = amount.lstrip("-").partition(".")
    v = int(whole) * 100 + int((frac + "00")[:2])
    return -v if amount.startswith("-") else v


def _money(cents: int) -> str:
    return f"{cents / 100:.2f}"


def invoice_to_ledger(w: World, rng: random.Random) -> dict:
    v = rng.choice(w.vendors)
    acct = {"travel": "travel", "software": "software"}.get(v["category"], "operations")
    msg = next(m for m in w.messages if m["subject"] == f"Invoice {v['invoice']}")
    neg = f"-{v['amount']}"
    return {
        "prompt": f"Find the invoice email from {v['name']} and record it in the ledger: account '{acct}', category "
                  f"'{v['category']}', dated the day of the email, the invoice number as the reference, the amount as "
                  "an expense. Then submit the amount.",
        "services": ("mail", "ledger"),
        "items": [Item("entry recorded", "state", "sql_count", {
            "service": "ledger", "sql": "select count(*) from entries where account = ? and reference = ? and "
                                        "amount_cents = ? and date = ? and category = ?",
            "params": [acct, v["invoice"], _cents(neg), msg["date"], v["category"]], "expect": 1}),
            Item("amount in the answer", "reply", "states_amount", {"value": _cents(v["amount"]), "either_sign": True}),
            Item("nothing else changed", "negative", "unchanged", {"allow": {
                "ledger.entries": {"insert": 1}, "mail.messages": {"update": {"unread": "*"}}}})],
        "plan": [("mail__search_messages", {"query": v["name"].split()[0]}), ("mail__read_message", {"id": msg["id"]}),
                 ("ledger__add_entry", {"date": msg["date"], "description": f"{v['name']} invoice {v['invoice']}",
                                        "amount": neg, "category": v["category"], "account": acct,
                                        "reference": v["invoice"]})],
        "answer": v["amount"]}


def _balance_of(acct: str) -> dict:
    """The balance of ``acct`` in the final ledger (what an answer or a reply about it must state),
    and the other accounts (which the sentence stating it must not name)."""
    return {"value": {"service": "ledger", "params": [acct],
                      "sql": "select coalesce(sum(amount_cents), 0) from entries where account = ?"},
            "rivals": {"service": "ledger", "sql": "select name from accounts where name != ?", "params": [acct]}}


def balance_question(w: World, rng: random.Random) -> dict:
    acct = rng.choice(("operations", "travel", "software"))
    bal = _money(sum(e["amount_cents"] for e in w.entries if e["account"] == acct))
    return {"prompt": f"What is the current balance of the '{acct}' ledger account? Submit the amount.",
            "services": ("ledger",),
            "items": [Item("balance in the answer", "reply", "states_amount", _balance_of(acct)),
                      Item("nothing changed", "negative", "unchanged", {})],
            "plan": [("ledger__get_balance", {"account": acct})], "answer": bal}


def reply_with_balance(w: World, rng: random.Random) -> dict:
    m = rng.choice([m for m in w.messages if m["sender"].endswith("@northwind.test") and m["sender"] != "news@"
                    "northwind.test"])
    who = next(p for p in w.people if p["email"] == m["sender"])
    acct = rng.choice(("operations", "travel", "software"))
    bal = _money(sum(e["amount_cents"] for e in w.entries if e["account"] == acct))
    return {"prompt": f"Reply to {who['name']}'s email '{m['subject']}' with the current balance of the '{acct}' "
                      "ledger account.",
            "services": ("mail", "ledger"),
            "items": [Item("reply sent to them alone", "state", "address_set", {
                "service": "mail", "sql": "select recipients from messages where folder = 'sent' and in_reply_to = ?",
                "params": [m["id"]], "addresses": [who["email"]]}),
                Item("reply gives the balance", "state", "states_amount", {
                    **_balance_of(acct), "text": {"service": "mail", "sql": "select body from messages where folder = "
                                                                           "'sent' and in_reply_to = ?",
                                                  "params": [m["id"]]}}),
                Item("nothing else changed", "negative", "unchanged", {"allow": {
                    "mail.messages": {"insert": 1, "update": {"unread": "*"}}}})],
            "plan": [("ledger__get_balance", {"account": acct}),
                     ("mail__search_messages", {"query": m["subject"]}),
                     ("mail__send_message", {"to": who["email"], "subject": f"Re: {m['subject']}",
                                             "body": f"The {acct} balance is {bal}.", "in_reply_to": m["id"]})],
            "answer": "sent"}


def schedule_first_free(w: World, rng: random.Random) -> dict:
    who = rng.choice(w.people)
    day = rng.choice(sorted({e["start"][:10] for e in w.events}))
    busy = [(e["start"][11:], e["end"][11:]) for e in w.events if e["start"][:10] == day and e["status"] == "confirmed"]
    slot = next(f"{h:02d}:{m:02d}" for h in range(9, 17) for m in (0, 30)
                if all(not (s < _plus30(f"{h:02d}:{m:02d}") and e > f"{h:02d}:{m:02d}") for s, e in busy))
    title = rng.choice(("1:1", "Quick sync", "Planning chat", "Check-in"))
    start, end = f"{day}T{slot}", f"{day}T{_plus30(slot)}"
    return {"prompt": f"Schedule a 30-minute meeting titled '{title}' with {who['name']} on {day}, at the earliest "
                      "half-hour slot between 09:00 and 17:00 that does not overlap your calendar. Invite them by "
                      "their email address.",
            "services": ("calendar", "mail"),
            "items": [Item("event at the first free slot", "state", "sql_count", {
                "service": "calendar", "sql": "select count(*) from events where title = ? and start = ? and end = ? "
                                              "and status = 'confirmed'",
                "params": [title, start, end], "expect": 1}),
                Item("only them invited", "state", "address_set", {
                    "service": "calendar", "sql": "select attendees from events where title = ? and start = ?",
                    "params": [title, start], "addresses": [who["email"]]}),
                Item("nothing else changed", "negative", "unchanged", {"allow": {"calendar.events": {"insert": 1}}})],
            "plan": [("mail__find_contacts", {"query": who["name"].split()[0]}),
                     ("calendar__list_events", {"start_date": day, "end_date": day}),
                     ("calendar__create_event", {"title": title, "start": start, "end": end,
                                                 "attendees": who["email"]})],
            "answer": f"scheduled at {slot}"}


def _plus30(hhmm: str) -> str:
    h, m = map(int, hhmm.split(":"))
    t = h * 60 + m + 30
    return f"{t // 60:02d}:{t % 60:02d}"


def triage_tickets(w: World, rng: random.Random) -> dict:
    t = rng.choice([t for t in w.tickets if t["status"] in ("open", "in_progress")])
    topic = t["title"].split()[0]
    targets = [x for x in w.tickets if x["title"].split()[0] == topic and x["status"] in ("open", "in_progress")]
    who = rng.choice([p for p in w.people if all(x["assignee"] != p["email"] for x in targets)])  # a real change
    ids = [x["id"] for x in targets]
    return {"prompt": f"Assign every open or in-progress ticket about '{topic}' to {who['name']} and set its "
                      "priority to high.",
            "services": ("tickets", "mail"),
            "items": [Item("tickets assigned", "state", "sql_count", {
                "service": "tickets", "sql": f"select count(*) from tickets where id in ({', '.join('?' * len(ids))}) "
                                             "and assignee = ? and priority = 'high'",
                "params": [*ids, who["email"]], "expect": len(ids)}),
                Item("nothing else changed", "negative", "unchanged", {"allow": {
                    "tickets.tickets": {"update": {"assignee": ids, "priority": ids}}}})],
            "plan": [("mail__find_contacts", {"query": who["name"].split()[0]}), ("tickets__list_tickets", {}),
                     *[("tickets__update_ticket", {"id": i, "priority": "high", "assignee": who["email"]})
                       for i in ids]],
            "answer": f"assigned {len(ids)}"}


def category_report(w: World, rng: random.Random) -> dict:
    cat = rng.choice(sorted({e["category"] for e in w.entries}))
    rows = [[e["date"], e["description"], _money(e["amount_cents"])] for e in w.entries if e["category"] == cat]
    path = f"reports/{cat}.csv"
    content = "date,description,amount\n" + "".join(f"{d},{s},{a}\n" for d, s, a in sorted(rows))
    return {"prompt": f"Write the document {path}: a CSV with the header 'date,description,amount' and one row per "
                      f"ledger entry of category '{cat}' (amounts as the ledger shows them).",
            "services": ("ledger", "files"),
            "items": [Item("report written", "state", "document", {"path": path, "header": ["date", "description",
                                                                                         "amount"], "rows": rows}),
                      Item("nothing else changed", "negative", "unchanged", {"files": [path]})],
            "plan": [("ledger__list_entries", {"category": cat, "limit": 50}),
                     ("files__write_file", {"path": path, "content": content})],
            "answer": "written"}


def cancel_and_notify(w: World, rng: random.Random) -> dict:
    mine = [e for e in w.events if e["organizer"] == ME]
    if not mine:
        return {**balance_question(w, rng), "template": "balance_question"}
    e = rng.choice(mine)
    people = [p.strip() for p in e["attendees"].split(",")]
    sent = "select subject || char(10) || body from messages where folder = 'sent'"
    return {"prompt": f"Cancel your event '{e['title']}' on {e['start'][:10]} and send one email to all its "
                      "attendees saying it is cancelled.",
            "services": ("calendar", "mail"),
            "items": [Item("event cancelled", "state", "sql_count", {
                "service": "calendar", "sql": "select count(*) from events where id = ? and status = 'cancelled'",
                "params": [e["id"]], "expect": 1}),
                Item("attendees told, no one else", "state", "address_set", {
                    "service": "mail", "sql": "select recipients from messages where folder = 'sent'", "params": [],
                    "addresses": people}),
                Item("email says it is cancelled", "state", "says_cancelled", {
                    "service": "mail", "sql": sent, "params": [], "title": e["title"]}),
                Item("a judge reads it as cancelled", "judged", "judged", {
                    "service": "mail", "sql": sent, "params": [], "decided_by": "email says it is cancelled",
                    "criterion": f"Does this email tell its readers that the event '{e['title']}' on "
                                 f"'{e['start'][:10]}' is cancelled (called off: not moved, postponed or still on)?"}),
                Item("nothing else changed", "negative", "unchanged", {"allow": {
                    "calendar.events": {"update": {"status": [e["id"]]}}, "mail.messages": {"insert": 1}}})],
            "plan": [("calendar__list_events", {"start_date": e["start"][:10], "end_date": e["start"][:10]}),
                     ("calendar__cancel_event", {"id": e["id"]}),
                     ("mail__send_message", {"to": ", ".join(people), "subject": f"Cancelled: {e['title']}",
                                             "body": f"'{e['title']}' on {e['start'][:10]} is cancelled."})],
            "answer": "cancelled"}


def resolve_with_comment(w: World, rng: random.Random) -> dict:
    t = rng.choice([t for t in w.tickets if t["status"] in ("open", "in_progress")])
    note = rng.choice(("Fixed by a restart.", "Replaced the part.", "Config corrected."))
    return {"prompt": f"Ticket #{t['id']} is fixed: add the comment '{note}' to it, then mark it resolved.",
            "services": ("tickets",),
            "items": [Item("comment added", "state", "sql_count", {
                "service": "tickets", "sql": "select count(*) from comments where ticket_id = ? and body = ?",
                "params": [t["id"], note], "expect": 1}),
                Item("ticket resolved", "state", "sql_count", {
                    "service": "tickets", "sql": "select count(*) from tickets where id = ? and status = 'resolved'",
                    "params": [t["id"]], "expect": 1}),
                Item("nothing else changed", "negative", "unchanged", {"allow": {
                    "tickets.comments": {"insert": 1}, "tickets.tickets": {"update": {"status": [t["id"]]}}}})],
            "plan": [("tickets__get_ticket", {"id": t["id"]}), ("tickets__add_comment", {"id": t["id"], "body": note}),
                     ("tickets__update_ticket", {"id": t["id"], "status": "resolved"})],
            "answer": "resolved"}


TEMPLATES = {f.__name__: f for f in (invoice_to_ledger, balance_question, reply_with_balance, schedule_first_free,
                                     triage_tickets, category_report, cancel_and_notify, resolve_with_comment)}
SPLIT_SALT = {"train": "train", "sft": "train", "heldout": "heldout"}


SINGLE_SERVICE = ("balance_question", "resolve_with_comment")
"""The templates that use one service: the easy tier (``general_templates``)."""


def make_task(split: str, index: int, templates: tuple[str, ...] | None = None) -> GeneralTask:
    """Task ``index`` of ``split`` ('sft' draws from the train worlds): template ``index`` modulo
    ``templates`` (default: all eight, in ``TEMPLATES``' order) on the world of ``(split, index)``."""
    names = templates or tuple(TEMPLATES)
    name = names[index % len(names)]
    digest = hashlib.sha256(f"general:{SPLIT_SALT[split]}:{index}".encode()).digest()
    seed = int.from_bytes(digest[:8], "big")
    spec = TEMPLATES[name](World.make(seed), random.Random(seed ^ 0x5EED))
    name = spec.get("template", name)
    return GeneralTask(f"general-{SPLIT_SALT[split]}-{index:05d}-{name}", seed, name, spec["prompt"],
                       tuple(spec["services"]), tuple(spec["items"]), tuple(spec["plan"]), spec["answer"],
                       split="heldout" if split == "heldout" else "train", extra={"me": ME, "today": TODAY})
