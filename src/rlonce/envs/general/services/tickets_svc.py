"""Tickets: an issue tracker with a fixed workflow (open → in_progress → resolved → closed;
resolved may reopen) and comments."""

from __future__ import annotations

from pathlib import Path

from schemas import TICKETS as SCHEMA
from svc_common import EMAIL, connect, fail, limit_rows, one, pattern, rows, serve, text

PRIORITIES = ("low", "normal", "high", "urgent")
MOVES = {
    "open": ("in_progress", "resolved"),
    "in_progress": ("open", "resolved"),
    "resolved": ("closed", "open"),
    "closed": (),
}


class Tickets:
    def __init__(self, state: Path, me: str, today: str):
        self.me, self.today = me, today
        self.db = connect(state / "tickets.db", SCHEMA)

    def priority_ok(self, p: str) -> str:
        if p not in PRIORITIES:
            raise fail("bad_arguments", f"priority must be one of {', '.join(PRIORITIES)}")
        return p

    def list_tickets(self, status: str = "", assignee: str = "", limit: int = 20) -> dict:
        """Tickets, newest first, optionally of one status or assignee."""
        sql, args = "select id, title, status, priority, assignee, reporter, created from tickets where 1 = 1", []
        if status:
            if status not in MOVES:
                raise fail("bad_arguments", f"status must be one of {', '.join(MOVES)}")
            sql, args = sql + " and status = ?", [*args, status]
        if assignee:
            sql, args = sql + " and assignee = ?", [*args, assignee]
        return {"tickets": rows(self.db.execute(sql + " order by id desc limit ?", (*args, limit_rows(limit))))}

    def get_ticket(self, id: int) -> dict:
        """One ticket with its comments."""
        t = one(self.db, "select * from tickets where id = ?", (id,), f"ticket {id}")
        return {
            **t,
            "comments": rows(
                self.db.execute("select author, body, created from comments where ticket_id = ? order by id", (id,))
            ),
        }

    def create_ticket(self, title: str, description: str, priority: str = "normal", assignee: str = "") -> dict:
        """Open a ticket reported by you."""
        if assignee:
            pattern(assignee, EMAIL, "assignee", "an email address")
        values = (
            text(title, "title", limit=200),
            text(description, "description"),
            self.priority_ok(priority),
            assignee,
            self.me,
            self.today,
        )
        cur = self.db.execute(
            "insert into tickets (title, description, priority, assignee, reporter, created) values (?, ?, ?, ?, ?, ?)",
            values,
        )
        return {"id": cur.lastrowid, "status": "open"}

    def update_ticket(self, id: int, status: str = "", priority: str = "", assignee: str = "") -> dict:
        """Change a ticket's status (along the workflow), priority or assignee."""
        t = one(self.db, "select * from tickets where id = ?", (id,), f"ticket {id}")
        if t["status"] == "closed":
            raise fail("permission_denied", f"ticket {id} is closed")
        if status and status != t["status"] and status not in MOVES.get(t["status"], ()):
            raise fail("conflict", f"ticket {id} cannot go from {t['status']} to {status}")
        new = {
            "status": status or t["status"],
            "priority": self.priority_ok(priority) if priority else t["priority"],
            "assignee": pattern(assignee, EMAIL, "assignee", "an email address") if assignee else t["assignee"],
        }
        self.db.execute("update tickets set status = ?, priority = ?, assignee = ? where id = ?", (*new.values(), id))
        return {"id": id, **new}

    def add_comment(self, id: int, body: str) -> dict:
        """Comment on a ticket."""
        if one(self.db, "select status from tickets where id = ?", (id,), f"ticket {id}")["status"] == "closed":
            raise fail("permission_denied", f"ticket {id} is closed")
        cur = self.db.execute(
            "insert into comments (ticket_id, author, body, created) values (?, ?, ?, ?)",
            (id, self.me, text(body, "body"), self.today),
        )
        return {"id": cur.lastrowid, "ticket_id": id}


TOOLS = ("list_tickets", "get_ticket", "create_ticket", "update_ticket", "add_comment")


def build(state: Path, me: str, today: str):
    svc = Tickets(state, me, today)
    me, today = svc.me, svc.today
    return serve(
        svc,
        TOOLS,
        "tickets",
        instructions=f"The team's tracker; you are {me}. Workflow: open -> in_progress -> "
        "resolved -> closed (resolved may reopen).",
    )
