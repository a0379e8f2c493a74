"""Calendar: the user's events; the user may change only the events it organizes."""

from __future__ import annotations

from pathlib import Path

from schemas import CALENDAR as SCHEMA
from svc_common import DATE, DATETIME, EMAIL, connect, fail, one, pattern, rows, serve, text


class Calendar:
    def __init__(self, state: Path, me: str, today: str):
        self.me, self.today = me, today
        self.db = connect(state / "calendar.db", SCHEMA)

    def span(self, start: str, end: str) -> tuple[str, str]:
        pattern(start, DATETIME, "start", "a time YYYY-MM-DDTHH:MM")
        pattern(end, DATETIME, "end", "a time YYYY-MM-DDTHH:MM")
        if end <= start:
            raise fail("bad_arguments", "end must be after start")
        return start, end

    def clash(self, start: str, end: str, skip: int = 0) -> None:
        r = self.db.execute(
            "select id, title from events where status = 'confirmed' and id != ? and start < ? and end > ?",
            (skip, end, start),
        ).fetchone()
        if r is not None:
            raise fail("conflict", f"overlaps event {r['id']} ({r['title']})")

    def mine(self, id: int) -> dict:
        ev = one(self.db, "select * from events where id = ?", (id,), f"event {id}")
        if ev["organizer"] != self.me:
            raise fail("permission_denied", f"event {id} is organized by {ev['organizer']}")
        return ev

    def list_events(self, start_date: str, end_date: str) -> dict:
        """Events starting on days from ``start_date`` to ``end_date`` (YYYY-MM-DD, inclusive)."""
        pattern(start_date, DATE, "start_date", "a date YYYY-MM-DD")
        pattern(end_date, DATE, "end_date", "a date YYYY-MM-DD")
        return {
            "events": rows(
                self.db.execute(
                    "select * from events where substr(start, 1, 10) between ? and ? order by start",
                    (start_date, end_date),
                )
            )
        }

    def get_event(self, id: int) -> dict:
        """One event."""
        return one(self.db, "select * from events where id = ?", (id,), f"event {id}")

    def create_event(self, title: str, start: str, end: str, attendees: str = "", location: str = "") -> dict:
        """Schedule an event organized by the user (``attendees``: comma-separated addresses)."""
        start, end = self.span(start, end)
        people = [pattern(a.strip(), EMAIL, "attendee", "an email address") for a in attendees.split(",") if a.strip()]
        self.clash(start, end)
        cur = self.db.execute(
            "insert into events (title, start, end, location, organizer, attendees) values (?, ?, ?, ?, ?, ?)",
            (
                text(title, "title", limit=200),
                start,
                end,
                text(location, "location", required=False, limit=200),
                self.me,
                ", ".join(people),
            ),
        )
        return {"id": cur.lastrowid, "status": "confirmed"}

    def reschedule_event(self, id: int, start: str, end: str) -> dict:
        """Move an event the user organizes to a new time."""
        ev = self.mine(id)
        if ev["status"] != "confirmed":
            raise fail("conflict", f"event {id} is {ev['status']}")
        start, end = self.span(start, end)
        self.clash(start, end, skip=id)
        self.db.execute("update events set start = ?, end = ? where id = ?", (start, end, id))
        return {"id": id, "start": start, "end": end}

    def cancel_event(self, id: int) -> dict:
        """Cancel an event the user organizes."""
        if self.mine(id)["status"] == "cancelled":
            raise fail("conflict", f"event {id} is already cancelled")
        self.db.execute("update events set status = 'cancelled' where id = ?", (id,))
        return {"id": id, "status": "cancelled"}


TOOLS = ("list_events", "get_event", "create_event", "reschedule_event", "cancel_event")


def build(state: Path, me: str, today: str):
    svc = Calendar(state, me, today)
    me, today = svc.me, svc.today
    return serve(
        svc,
        TOOLS,
        "calendar",
        instructions=f"The calendar of {me}. Times are local, 'YYYY-MM-DDTHH:MM' (today is {today}).",
    )
