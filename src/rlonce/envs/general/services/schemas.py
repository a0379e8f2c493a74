"""The services' database schemas: read by the services (``*_svc.py``) and by the host, which seeds
the initial state and grades the final one (``rlonce.envs.general.world``, ``.rubric``). No imports."""

MAIL = """
create table if not exists messages (id integer primary key, folder text not null, sender text not null,
  recipients text not null, subject text not null, body text not null, date text not null,
  unread integer not null default 1, in_reply_to integer);
create table if not exists contacts (id integer primary key, name text not null, email text not null unique,
  company text not null default '', phone text not null default '');
"""

CALENDAR = """
create table if not exists events (id integer primary key, title text not null, start text not null,
  end text not null, location text not null default '', organizer text not null,
  attendees text not null default '', status text not null default 'confirmed');
"""

TICKETS = """
create table if not exists tickets (id integer primary key, title text not null, description text not null,
  status text not null default 'open', priority text not null default 'normal', assignee text not null default '',
  reporter text not null, created text not null);
create table if not exists comments (id integer primary key, ticket_id integer not null, author text not null,
  body text not null, created text not null);
"""

LEDGER = """
create table if not exists accounts (name text primary key, closed_through text not null default '');
create table if not exists entries (id integer primary key, date text not null, description text not null,
  amount_cents integer not null, category text not null, account text not null, reference text not null default '');
"""

SCHEMAS = {"mail": MAIL, "calendar": CALENDAR, "tickets": TICKETS, "ledger": LEDGER}
"""Service name → its schema; ``files`` keeps documents as files, not rows."""
