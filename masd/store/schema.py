"""The SQLite schema of masd, as an ordered registry of migrations.

Conventions every table follows:

- **Timestamps** (every ``*_at`` column, ``deliver_until``) are ``REAL`` epoch
  seconds, UTC (``time.time()``).  Range queries (deadlines, due outbox rows,
  7-day dedupe and idempotency windows, the rolling 24 h send cap) are plain
  numeric comparisons.  RFC 3339 strings appear only inside JSON payloads and
  on the wire; the read side formats ``at`` when it shows a thread.
- **JSON columns** (``policy``, ``event``, ``details``, ``data``) are ``TEXT``
  holding one JSON document (see :func:`dumps`); a ``CHECK
  (json_valid(..))`` refuses anything else.
- Tables are ``STRICT``: a value of the wrong type (a timestamp string in a
  ``REAL`` column, say) is refused by SQLite instead of being stored.
- Enumerations (roles, statuses, thread kinds, outbox states) are ``CHECK``
  constraints, so a misspelt value is refused at the row that carries it.
  Their names come from :mod:`masd.core.kinds` and the status table;
  ``tests/test_schema.py`` holds the constraints to them.
- Foreign keys are immediate (never ``DEFERRABLE``): several jobs share one
  transaction (group commit), and a deferred violation would only surface at
  ``COMMIT`` and fail the whole batch instead of the one job at fault.  Insert
  parents first (a case before its thread entries, a handoff before its
  statuses).

A migration is ``(version, name, apply)``; ``apply`` is SQL text (one or more
statements) or a callable taking the ``sqlite_utils.Database``.  Versions
start at 1 and have no gaps.  Applied migrations are recorded in
``masd_migrations``.

A released migration is a frozen literal: never edit it, never build it from
a constant that may change (a store migrated by the old text would differ
from one migrated by the new, with nothing to tell them apart).  Change the
schema by appending a migration; ``tests/test_schema.py`` pins each released
text by its SHA-256 and the schema they build together.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import NamedTuple

from sqlite_utils import Database

from masd.core.errors import MasdError
from masd.core.kinds import THREAD_KINDS


class Migration(NamedTuple):
    version: int
    name: str
    apply: str | Callable[[Database], None]


#: Migration 1, as released.
INITIAL = """
CREATE TABLE id_counters (
    domain TEXT NOT NULL,
    type   TEXT NOT NULL,
    next_n INTEGER NOT NULL CHECK (next_n >= 1),
    PRIMARY KEY (domain, type)
) STRICT;

CREATE TABLE cases (
    key         TEXT PRIMARY KEY NOT NULL,
    address     TEXT NOT NULL UNIQUE,
    domain      TEXT NOT NULL,
    type        TEXT NOT NULL,
    id          TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('master', 'slave')),
    participant TEXT,
    created_at  REAL NOT NULL,
    policy      TEXT CHECK (policy IS NULL OR json_valid(policy)),
    thread_seq  INTEGER NOT NULL DEFAULT 0 CHECK (thread_seq >= 0),
    sent_count  INTEGER NOT NULL DEFAULT 0 CHECK (sent_count >= 0)
) STRICT;
CREATE INDEX cases_domain_type ON cases (domain, type);

CREATE TABLE messages (
    message_ref  TEXT PRIMARY KEY NOT NULL,
    case_key     TEXT REFERENCES cases (key),
    intake_ref   TEXT,
    rcpt_to      TEXT NOT NULL,
    mail_from    TEXT NOT NULL,
    message_id   TEXT,
    from_address TEXT,
    sha256       TEXT NOT NULL,
    size         INTEGER NOT NULL CHECK (size >= 0),
    raw          BLOB NOT NULL,
    event        TEXT NOT NULL CHECK (json_valid(event)),
    received_at  REAL NOT NULL
) STRICT;
CREATE INDEX messages_case ON messages (case_key, received_at);
CREATE INDEX messages_intake ON messages (intake_ref) WHERE intake_ref IS NOT NULL;

CREATE TABLE intakes (
    intake_ref     TEXT PRIMARY KEY NOT NULL,
    domain         TEXT NOT NULL,
    type           TEXT NOT NULL,
    message_ref    TEXT NOT NULL,
    requested_mode TEXT,
    case_key       TEXT REFERENCES cases (key),
    created_at     REAL NOT NULL,
    assigned_at    REAL,
    CHECK ((case_key IS NULL) = (assigned_at IS NULL))
) STRICT;
CREATE INDEX intakes_case ON intakes (case_key) WHERE case_key IS NOT NULL;
CREATE INDEX intakes_pending ON intakes (domain, type, created_at) WHERE case_key IS NULL;

CREATE TABLE deliveries (
    dedupe      TEXT PRIMARY KEY NOT NULL,
    message_ref TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT;
CREATE INDEX deliveries_at ON deliveries (at);

CREATE TABLE handoffs (
    handoff_id   TEXT PRIMARY KEY NOT NULL,
    case_key     TEXT NOT NULL REFERENCES cases (key),
    mode         TEXT NOT NULL,
    peer         TEXT,
    status       TEXT NOT NULL CHECK (status IN ('requested', 'negotiating', 'scheduled', 'attempted', 'running', 'completed', 'failed', 'expired', 'refused', 'cancelled', 'timed-out')),
    last_seq     INTEGER,
    requested_at REAL NOT NULL,
    deadline_at  REAL,
    closed_at    REAL,
    forwarded    INTEGER NOT NULL DEFAULT 0 CHECK (forwarded IN (0, 1)),
    webhook_url  TEXT,
    details      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(details))
) STRICT;
CREATE INDEX handoffs_case ON handoffs (case_key, requested_at);
CREATE INDEX handoffs_open_deadline ON handoffs (deadline_at) WHERE closed_at IS NULL;

CREATE TABLE statuses (
    handoff_id TEXT NOT NULL REFERENCES handoffs (handoff_id),
    n          INTEGER NOT NULL CHECK (n >= 1),
    seq        INTEGER,
    status     TEXT NOT NULL CHECK (status IN ('requested', 'negotiating', 'scheduled', 'attempted', 'running', 'completed', 'failed', 'expired', 'refused', 'cancelled', 'timed-out')),
    source     TEXT NOT NULL CHECK (source IN ('email', 'mode', 'master')),
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    at         REAL NOT NULL,
    PRIMARY KEY (handoff_id, n)
) STRICT;

CREATE TABLE thread (
    case_key TEXT NOT NULL REFERENCES cases (key),
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL CHECK (kind IN ('contract.in', 'contract.out', 'delivery.failed', 'mail.in', 'mail.out', 'mail.refused', 'status')),
    at       REAL NOT NULL,
    data     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    PRIMARY KEY (case_key, seq)
) STRICT;

CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL CHECK (kind IN ('contract', 'mail')),
    queue           TEXT NOT NULL,
    peer            TEXT,
    case_key        TEXT,
    url             TEXT,
    payload         ANY NOT NULL,
    created_at      REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      TEXT,
    state           TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'done', 'failed', 'abandoned')),
    deliver_until   REAL NOT NULL
) STRICT;
CREATE INDEX outbox_due ON outbox (state, next_attempt_at);
CREATE INDEX outbox_queue ON outbox (queue, id) WHERE state = 'pending';

CREATE TABLE idempotency (
    peer   TEXT NOT NULL,
    id     TEXT NOT NULL,
    status INTEGER NOT NULL,
    body   TEXT NOT NULL,
    at     REAL NOT NULL,
    PRIMARY KEY (peer, id)
) STRICT;
CREATE INDEX idempotency_at ON idempotency (at);

CREATE TABLE send_log (
    id        INTEGER PRIMARY KEY,
    case_key  TEXT NOT NULL,
    recipient TEXT NOT NULL,
    at        REAL NOT NULL
) STRICT;
CREATE INDEX send_log_recipient ON send_log (recipient, at);
"""  # noqa: E501

MIGRATIONS: tuple[Migration, ...] = (Migration(1, "initial", INITIAL),)


#: One encoder for every call (``json.dumps`` with options builds a new one each
#: time); it keeps no state between calls, so threads may share it.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def dumps(value: object) -> str:
    """The one JSON encoding of the JSON columns: compact, UTF-8, keys sorted."""
    return _ENCODER.encode(value)


def next_number(db: Database, domain: str, type_: str) -> int:
    """Take the next master-role id number for (domain, type): 1, 2, ...

    PROFILE §1: "email assigns ids ``<id_prefix><n>`` ... n = 1, 2, … per
    domain and type, never reused."  The bump is part of the caller's job, so
    a job that rolls back gives its number back only together with the case
    that would have used it.
    """
    rows = db.execute(
        "INSERT INTO id_counters (domain, type, next_n) VALUES (?, ?, 2) "
        "ON CONFLICT (domain, type) DO UPDATE SET next_n = next_n + 1 "
        "RETURNING next_n - 1",
        (domain, type_),
    ).fetchall()
    return int(rows[0][0])


def append_thread(
    db: Database, case_key: str, kind: str, data: Mapping[str, object], *, at: float
) -> int:
    """Append one entry to a case's thread and return its per-case ``seq``.

    ``seq`` comes from ``cases.thread_seq``, bumped in the same job, so seqs
    are 1, 2, ... per case with no gaps and no reuse.
    """
    if kind not in THREAD_KINDS:
        raise MasdError(
            f"thread kind {kind!r} is not one of {sorted(THREAD_KINDS)}", code="bad-thread-kind"
        )
    rows = db.execute(
        "UPDATE cases SET thread_seq = thread_seq + 1 WHERE key = ? RETURNING thread_seq",
        (case_key,),
    ).fetchall()
    if not rows:
        raise MasdError(f"no case {case_key!r} to append a {kind} entry to", code="unknown-case")
    seq = int(rows[0][0])
    db.execute(
        "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, ?, ?, ?)",
        (case_key, seq, kind, float(at), dumps(dict(data))),
    )
    return seq
