"""Mail: the user's mailbox (inbox, archive, sent, trash) and address book."""

from __future__ import annotations

from pathlib import Path

from schemas import MAIL as SCHEMA
from svc_common import EMAIL, connect, fail, limit_rows, one, pattern, rows, serve, text

FOLDERS = ("inbox", "archive", "sent", "trash")
SUMMARY = "id, folder, sender, recipients, subject, date, unread"


class Mail:
    def __init__(self, state: Path, me: str, today: str):
        self.me, self.today = me, today
        self.db = connect(state / "mail.db", SCHEMA)

    def folder_ok(self, folder: str) -> str:
        if folder not in FOLDERS:
            raise fail("bad_arguments", f"folder must be one of {', '.join(FOLDERS)}")
        return folder

    def list_messages(
        self, folder: str = "inbox", unread_only: bool = False, sender: str = "", limit: int = 20
    ) -> dict:
        """Messages of a folder, newest first (summaries: no body)."""
        sql = f"select {SUMMARY} from messages where folder = ?"
        args: list = [self.folder_ok(folder)]
        if unread_only:
            sql += " and unread = 1"
        if sender:
            sql, args = sql + " and sender = ?", [*args, sender]
        return {
            "messages": rows(self.db.execute(sql + " order by date desc, id desc limit ?", (*args, limit_rows(limit))))
        }

    def search_messages(self, query: str, limit: int = 20) -> dict:
        """Messages whose subject, body or sender contains ``query`` (any folder), newest first."""
        q = f"%{text(query, 'query', limit=200)}%"
        return {
            "messages": rows(
                self.db.execute(
                    f"select {SUMMARY} from messages where subject like ? or body like ? "
                    "or sender like ? order by date desc, id desc limit ?",
                    (q, q, q, limit_rows(limit)),
                )
            )
        }

    def read_message(self, id: int) -> dict:
        """One message with its body; marks it read."""
        msg = one(self.db, "select * from messages where id = ?", (id,), f"message {id}")
        self.db.execute("update messages set unread = 0 where id = ?", (id,))
        return {**msg, "unread": 0}

    def send_message(self, to: str, subject: str, body: str, in_reply_to: int = 0) -> dict:
        """Send a message (``to``: comma-separated addresses); a copy is kept in 'sent'."""
        rcpt = [pattern(a.strip(), EMAIL, "recipient", "an email address") for a in to.split(",") if a.strip()]
        if not rcpt:
            raise fail("bad_arguments", "to must name at least one recipient")
        if in_reply_to:
            one(self.db, "select id from messages where id = ?", (in_reply_to,), f"message {in_reply_to} to reply to")
        cur = self.db.execute(
            "insert into messages (folder, sender, recipients, subject, body, date, unread, in_reply_to) "
            "values ('sent', ?, ?, ?, ?, ?, 0, ?)",
            (
                self.me,
                ", ".join(rcpt),
                text(subject, "subject", limit=300),
                text(body, "body"),
                self.today,
                in_reply_to or None,
            ),
        )
        return {"id": cur.lastrowid, "status": "sent"}

    def move_message(self, id: int, folder: str) -> dict:
        """Move a message to another folder (inbox, archive, trash); sent mail stays in 'sent'."""
        msg = one(self.db, "select id, folder from messages where id = ?", (id,), f"message {id}")
        if msg["folder"] == "sent" or self.folder_ok(folder) == "sent":
            raise fail("permission_denied", "sent mail cannot be moved in or out of 'sent'")
        if msg["folder"] == folder:
            raise fail("conflict", f"message {id} is already in {folder}")
        self.db.execute("update messages set folder = ? where id = ?", (folder, id))
        return {"id": id, "folder": folder}

    def find_contacts(self, query: str = "") -> dict:
        """Address-book entries whose name, email or company contains ``query`` ('' lists all)."""
        q = f"%{query}%"
        return {
            "contacts": rows(
                self.db.execute(
                    "select * from contacts where name like ? or email like ? or company like ? order by name limit 50",
                    (q, q, q),
                )
            )
        }


TOOLS = ("list_messages", "search_messages", "read_message", "send_message", "move_message", "find_contacts")


def build(state: Path, me: str, today: str):
    svc = Mail(state, me, today)
    me, today = svc.me, svc.today
    return serve(svc, TOOLS, "mail", instructions=f"The mailbox of {me}. Dates are ISO (today is {today}).")
