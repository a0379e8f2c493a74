"""A seeded office: the people, vendors, mail, calendar, tickets, books and documents every
general-tool-use task starts from, and its initial service state as bytes.

``World.make(seed)`` is deterministic: a task holds only its seed and parameters, and the
environment rebuilds the state at setup (``World.state``: workspace path → bytes, one SQLite file
per service and the ``files/`` documents), so every rollout starts from the same fixed state.
"""

from __future__ import annotations

import importlib.util
import random
import sqlite3
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ME = "me@northwind.test"
TODAY = "2026-03-16"
FIRST = ("Ana", "Ben", "Chloe", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemal", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara")
LAST = ("Alvarez", "Brandt", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ivanova", "Jensen",
        "Kowalski", "Laine", "Moreau", "Nakamura", "Okafor", "Petrov")
VENDORS = (("Acme Supplies", "office"), ("Globex Travel", "travel"), ("Initech Software", "software"),
           ("Umbrella Hardware", "hardware"), ("Hooli Cloud", "software"), ("Stark Consulting", "services"),
           ("Wayne Rail", "travel"), ("Soylent Catering", "office"))
TOPICS = ("printer", "VPN", "laptop", "badge", "wifi", "monitor", "backup", "email")
MEETINGS = ("Budget review", "Roadmap sync", "Hiring panel", "Vendor call", "Design critique", "Retro",
            "Security briefing", "Onboarding")
ACCOUNTS = (("operations", "2026-02-28"), ("travel", "2026-01-31"), ("software", ""))
MARCH_DAYS = [f"2026-03-{d:02d}" for d in range(2, 14)]


@cache
def schemas() -> dict[str, str]:
    """The services' schemas (``services/schemas.py``, a plain module the sandbox imports too)."""
    path = Path(__file__).resolve().parent / "services" / "schemas.py"
    spec = importlib.util.spec_from_file_location("rlonce_general_schemas", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return dict(mod.SCHEMAS)


def database(service: str, inserts: list[tuple[str, tuple]]) -> bytes:
    """A service's SQLite database holding ``inserts`` (sql, args), as file bytes."""
    db = sqlite3.connect(":memory:")
    db.executescript(schemas()[service])
    for sql, args in inserts:
        db.execute(sql, args)
    db.commit()
    data = db.serialize()
    db.close()
    return data


@dataclass
class World:
    seed: int
    people: list[dict] = field(default_factory=list)
    vendors: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    tickets: list[dict] = field(default_factory=list)
    entries: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, seed: int) -> World:
        w, rng = cls(seed), random.Random(seed)
        names = rng.sample([(f, la) for f in FIRST for la in LAST], 10)
        w.people = [{"id": i + 1, "name": f"{f} {la}", "email": f"{f.lower()}.{la.lower()}@northwind.test",
                     "company": "Northwind", "phone": f"+1-555-{rng.randrange(1000, 9999)}"}
                    for i, (f, la) in enumerate(names)]
        for name, cat in rng.sample(VENDORS, 5):
            slug = name.split()[0].lower()
            w.vendors.append({"name": name, "category": cat, "email": f"billing@{slug}.test",
                              "invoice": f"INV-{rng.randrange(10000, 99999)}", "amount": f"{rng.randrange(40, 4000)}."
                              f"{rng.randrange(100):02d}", "date": rng.choice(MARCH_DAYS)})
        w._mail(rng)
        w._calendar(rng)
        w._tickets(rng)
        w._books(rng)
        w.files = {"shared/expense-policy.md": "# Expense policy\nRecord every invoice in the ledger with its "
                                               "invoice number as the reference.\n",
                   "notes/todo.txt": "- follow up on invoices\n- book travel\n"}
        return w

    def _mail(self, rng: random.Random) -> None:
        msgs = [{"folder": "inbox", "sender": v["email"], "recipients": ME, "subject": f"Invoice {v['invoice']}",
                 "body": f"Hello,\n\nplease find invoice {v['invoice']} from {v['name']}. Amount due: {v['amount']} "
                         f"EUR.\n\nRegards,\n{v['name']} billing", "date": v["date"]} for v in self.vendors]
        for p in rng.sample(self.people, 5):
            topic = rng.choice(MEETINGS)
            msgs.append({"folder": rng.choice(("inbox", "inbox", "archive")), "sender": p["email"], "recipients": ME,
                         "subject": topic, "body": f"Hi, can we talk about the {topic.lower()} this week? {p['name']}",
                         "date": rng.choice(MARCH_DAYS)})
        msgs.append({"folder": "inbox", "sender": "news@northwind.test", "recipients": ME, "subject": "Weekly news",
                     "body": "Cafeteria menu and parking updates.", "date": rng.choice(MARCH_DAYS)})
        msgs.sort(key=lambda m: (m["date"], m["subject"]))
        self.messages = [{"id": i + 1, "unread": int(rng.random() < 0.6), "in_reply_to": None, **m}
                         for i, m in enumerate(msgs)]

    def _calendar(self, rng: random.Random) -> None:
        evs = []
        for title in rng.sample(MEETINGS, 6):
            day = rng.choice([f"2026-03-{d}" for d in range(17, 21)])
            hour = rng.randrange(9, 16)
            who = rng.sample(self.people, 2)
            organizer = ME if rng.random() < 0.6 else who[0]["email"]
            evs.append({"title": title, "start": f"{day}T{hour:02d}:00", "end": f"{day}T{hour + 1:02d}:00",
                        "location": rng.choice(("Room A", "Room B", "Online")), "organizer": organizer,
                        "attendees": ", ".join(p["email"] for p in who), "status": "confirmed"})
        evs.sort(key=lambda e: e["start"])
        kept: list[dict] = []
        for e in evs:  # the seeded calendar has no overlaps, as the service would refuse them
            if all(e["start"] >= k["end"] or e["end"] <= k["start"] for k in kept):
                kept.append(e)
        self.events = [{"id": i + 1, **e} for i, e in enumerate(kept)]

    def _tickets(self, rng: random.Random) -> None:
        out = []
        for i in range(8):
            topic = TOPICS[i] if i < len(TOPICS) else rng.choice(TOPICS)
            reporter = rng.choice(self.people)
            out.append({"id": i + 1, "title": f"{topic.capitalize()} {rng.choice(('broken', 'slow', 'request'))}",
                        "description": f"The {topic} issue reported by {reporter['name']}.",
                        "status": rng.choice(("open", "open", "in_progress", "resolved")),
                        "priority": rng.choice(("low", "normal", "normal", "high")),
                        "assignee": rng.choice(["", *(p["email"] for p in self.people[:3])]),
                        "reporter": reporter["email"], "created": rng.choice(MARCH_DAYS)})
        self.tickets = out

    def _books(self, rng: random.Random) -> None:
        out = []
        for i in range(10):
            acct = rng.choice(ACCOUNTS)[0]
            cat = {"travel": "travel", "software": "software"}.get(acct, rng.choice(("office", "services", "hardware")))
            day = f"2026-{rng.choice(('01', '02', '03'))}-{rng.randrange(1, 28):02d}"
            out.append({"id": i + 1, "date": day, "description": f"{cat.capitalize()} expense {i + 1}",
                        "amount_cents": -rng.randrange(1000, 200000), "category": cat, "account": acct,
                        "reference": f"R-{1000 + i}"})
        self.entries = out

    def state(self) -> dict[str, bytes]:
        """The initial service state: workspace path → bytes."""
        def rows(table: str, items: list[dict]) -> list[tuple[str, tuple]]:
            return [(f"insert into {table} ({', '.join(r)}) values ({', '.join('?' * len(r))})", tuple(r.values()))
                    for r in items]

        out = {"mail.db": database("mail", rows("messages", self.messages) + rows("contacts", self.people)),
               "calendar.db": database("calendar", rows("events", self.events)),
               "tickets.db": database("tickets", rows("tickets", self.tickets)),
               "ledger.db": database("ledger", rows("accounts", [{"name": n, "closed_through": c} for n, c in ACCOUNTS])
                                     + rows("entries", self.entries))}
        out.update({f"files/{p}": t.encode() for p, t in self.files.items()})
        return out
