"""Ledger: expense and income entries per account, in cents; a closed period cannot change and an
invoice reference is recorded once per account."""

from __future__ import annotations

import re
from pathlib import Path

from schemas import LEDGER as SCHEMA
from svc_common import DATE, connect, fail, limit_rows, one, pattern, rows, serve, text

AMOUNT = re.compile(r"^-?\d{1,9}(\.\d{1,2})?$")
CATEGORIES = ("travel", "software", "hardware", "office", "services", "income", "other")


def cents(amount: str) -> int:
    pattern(amount, AMOUNT, "amount", "a decimal amount like 123.45")
    whole, _, frac = amount.lstrip("-").partition(".")
    value = int(whole) * 100 + int((frac + "00")[:2])
    return -value if amount.startswith("-") else value


class Ledger:
    def __init__(self, state: Path, me: str, today: str):
        self.me, self.today = me, today
        self.db = connect(state / "ledger.db", SCHEMA)

    def account_row(self, name: str) -> dict:
        return one(self.db, "select * from accounts where name = ?", (name,), f"account {name!r}")

    def open_on(self, acct: dict, date: str) -> None:
        if acct["closed_through"] and date <= acct["closed_through"]:
            raise fail("permission_denied", f"{acct['name']} is closed through {acct['closed_through']}")

    def list_accounts(self) -> dict:
        """Accounts and the date each is closed through."""
        return {"accounts": rows(self.db.execute("select * from accounts order by name"))}

    def list_entries(
        self, account: str = "", category: str = "", date_from: str = "", date_to: str = "", limit: int = 20
    ) -> dict:
        """Entries, newest first, filtered by account, category and date range (YYYY-MM-DD)."""
        sql, args = "select * from entries where 1 = 1", []
        for col, val in (("account", account), ("category", category)):
            if val:
                sql, args = sql + f" and {col} = ?", [*args, val]
        if date_from:
            sql, args = sql + " and date >= ?", [*args, pattern(date_from, DATE, "date_from", "a date YYYY-MM-DD")]
        if date_to:
            sql, args = sql + " and date <= ?", [*args, pattern(date_to, DATE, "date_to", "a date YYYY-MM-DD")]
        out = rows(self.db.execute(sql + " order by date desc, id desc limit ?", (*args, limit_rows(limit))))
        return {"entries": [{**r, "amount": f"{r.pop('amount_cents') / 100:.2f}"} for r in out]}

    def add_entry(
        self, date: str, description: str, amount: str, category: str, account: str, reference: str = ""
    ) -> dict:
        """Record an entry (an invoice ``reference`` at most once per account)."""
        a = self.account_row(account)
        pattern(date, DATE, "date", "a date YYYY-MM-DD")
        self.open_on(a, date)
        if category not in CATEGORIES:
            raise fail("bad_arguments", f"category must be one of {', '.join(CATEGORIES)}")
        if (
            reference
            and self.db.execute(
                "select id from entries where account = ? and reference = ?", (account, reference)
            ).fetchone()
        ):
            raise fail("conflict", f"reference {reference!r} is already recorded in {account}")
        cur = self.db.execute(
            "insert into entries (date, description, amount_cents, category, account, reference) "
            "values (?, ?, ?, ?, ?, ?)",
            (
                date,
                text(description, "description", limit=300),
                cents(amount),
                category,
                account,
                text(reference, "reference", required=False, limit=60),
            ),
        )
        return {"id": cur.lastrowid}

    def delete_entry(self, id: int) -> dict:
        """Delete an entry of an open period."""
        e = one(self.db, "select * from entries where id = ?", (id,), f"entry {id}")
        self.open_on(self.account_row(e["account"]), e["date"])
        self.db.execute("delete from entries where id = ?", (id,))
        return {"id": id, "deleted": True}

    def get_balance(self, account: str) -> dict:
        """The sum of an account's entries."""
        self.account_row(account)
        total = self.db.execute("select coalesce(sum(amount_cents), 0) from entries where account = ?", (account,))
        return {"account": account, "balance": f"{total.fetchone()[0] / 100:.2f}"}


TOOLS = ("list_accounts", "list_entries", "add_entry", "delete_entry", "get_balance")


def build(state: Path, me: str, today: str):
    svc = Ledger(state, me, today)
    me, today = svc.me, svc.today
    return serve(
        svc,
        TOOLS,
        "ledger",
        instructions="The company's books. Amounts are decimal strings ('123.45'; expenses "
        f"negative); categories: {', '.join(CATEGORIES)}.",
    )
