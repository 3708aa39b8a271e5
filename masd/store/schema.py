"""The SQLite schema of masd, as an ordered registry of migrations.

Conventions every table follows:

- **Timestamps** (every ``*_at`` column, ``deliver_until``) are ``REAL`` epoch
  seconds, UTC (``time.time()``).  Range queries (deadlines, due outbox rows,
  7-day dedupe and idempotency windows, the rolling 24 h send cap) are plain
  numeric comparisons.  RFC 3339 strings appear only inside JSON payloads and
  on the wire; the read side formats ``at`` when it shows a thread.
- **JSON columns** (``policy``, ``event``, ``details``, ``data``) are ``TEXT``
  holding one JSON document (see :func:`masd.store.sql.dumps`); a ``CHECK
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

from collections.abc import Callable
from typing import NamedTuple

from sqlite_utils import Database


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

#: Migration 2, as released: the read side's positions and delivery records.
#:
#: - ``thread.pos`` (``INTEGER PRIMARY KEY``, the rowid) numbers every entry of
#:   every case in commit order: the event feed's cursor.  Thread rows are never
#:   deleted, so a position is never given twice; as the rowid alias it survives
#:   ``VACUUM``, which may renumber a rowid that has no name.  The table is built
#:   anew with each entry at the position its rowid had.
#: - ``outbox.done_at``: when a row was delivered, failed or withdrawn.
#: - ``outbox_sent``: what is kept of a delivered row once housekeeping deletes
#:   it (the trigger ``outbox_sent_kept``), so its entry still reads ``sent``.
#: - ``mail.out`` and ``contract.out`` entries name their row (``outbox_id``);
#:   the entries written before this migration are linked here: a contract
#:   message by its id, a mail by its Message-ID.
READ_SIDE = """
ALTER TABLE thread RENAME TO thread_v1;

CREATE TABLE thread (
    pos      INTEGER PRIMARY KEY,
    case_key TEXT NOT NULL REFERENCES cases (key),
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL CHECK (kind IN ('contract.in', 'contract.out', 'delivery.failed', 'mail.in', 'mail.out', 'mail.refused', 'status')),
    at       REAL NOT NULL,
    data     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    UNIQUE (case_key, seq)
) STRICT;

INSERT INTO thread (pos, case_key, seq, kind, at, data)
    SELECT rowid, case_key, seq, kind, at, data FROM thread_v1 ORDER BY rowid;

DROP TABLE thread_v1;

ALTER TABLE outbox ADD COLUMN done_at REAL;

CREATE TABLE outbox_sent (
    id       INTEGER PRIMARY KEY NOT NULL,
    attempts INTEGER NOT NULL CHECK (attempts >= 0),
    done_at  REAL
) STRICT;

CREATE TRIGGER outbox_sent_kept AFTER DELETE ON outbox
    WHEN old.state = 'done' AND old.case_key IS NOT NULL
BEGIN
    INSERT OR REPLACE INTO outbox_sent (id, attempts, done_at)
        VALUES (old.id, old.attempts, old.done_at);
END;

UPDATE thread SET data = json_set(thread.data, '$.outbox_id', m.id)
    FROM (SELECT t.pos AS pos, MIN(o.id) AS id FROM thread t JOIN outbox o
          ON o.case_key = t.case_key AND o.kind = 'contract'
          AND json_extract(o.payload, '$.id') = json_extract(t.data, '$.id')
          WHERE t.kind = 'contract.out' GROUP BY t.pos) AS m
    WHERE thread.pos = m.pos;

UPDATE thread SET data = json_set(thread.data, '$.outbox_id', m.id)
    FROM (SELECT t.pos AS pos, MIN(o.id) AS id FROM thread t JOIN outbox o
          ON o.case_key = t.case_key AND o.kind = 'mail'
          AND instr(json_extract(o.payload, '$.message'),
                    'Message-ID: ' || json_extract(t.data, '$.message_id')) > 0
          WHERE t.kind = 'mail.out' GROUP BY t.pos) AS m
    WHERE thread.pos = m.pos;
"""  # noqa: E501

#: Migration 3, as released: ``messages.raw`` as the table's last column.
#:
#: SQLite builds a row's record from its values in column order.  A value in
#: the middle of a row is copied whole as the record is built (for a
#: ``zeroblob``, expanded into that many zero bytes first); a ``zeroblob``
#: that ends the row is written as its size alone, and the blob I/O that
#: follows fills its pages in place (:mod:`masd.store.messages`).  The table
#: is built anew (SQLite's own procedure for a change ``ALTER TABLE`` cannot
#: make: create, copy, drop, rename, index), every row with the rowid it had.
#: No table refers to ``messages`` by a foreign key, and no trigger or view
#: names it.
RAW_LAST = """
CREATE TABLE messages_v3 (
    message_ref  TEXT PRIMARY KEY NOT NULL,
    case_key     TEXT REFERENCES cases (key),
    intake_ref   TEXT,
    rcpt_to      TEXT NOT NULL,
    mail_from    TEXT NOT NULL,
    message_id   TEXT,
    from_address TEXT,
    sha256       TEXT NOT NULL,
    size         INTEGER NOT NULL CHECK (size >= 0),
    event        TEXT NOT NULL CHECK (json_valid(event)),
    received_at  REAL NOT NULL,
    raw          BLOB NOT NULL
) STRICT;

INSERT INTO messages_v3 (rowid, message_ref, case_key, intake_ref, rcpt_to, mail_from,
                         message_id, from_address, sha256, size, event, received_at, raw)
    SELECT rowid, message_ref, case_key, intake_ref, rcpt_to, mail_from,
           message_id, from_address, sha256, size, event, received_at, raw
    FROM messages ORDER BY rowid;

DROP TABLE messages;

ALTER TABLE messages_v3 RENAME TO messages;

CREATE INDEX messages_case ON messages (case_key, received_at);
CREATE INDEX messages_intake ON messages (intake_ref) WHERE intake_ref IS NOT NULL;
"""


#: Migration 4, as released: bounces (docs/protocol.md §22).
#:
#: - ``bounce_key``: the one secret bounce tags are made under.
#: - ``bounces``: each bounce recorded, by the message that carried it, naming the
#:   outbound mail (``outbox_id``) it reports on.
#: - ``suppressions``: permanently failed recipients, until when masd's own mails
#:   to them are refused.
#: - ``thread.kind`` also allows ``mail.bounced``: the table is built anew (SQLite
#:   cannot change a CHECK), each entry at its position.
BOUNCES = """
CREATE TABLE bounce_key (
    id         INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    secret     TEXT NOT NULL,
    created_at REAL NOT NULL
) STRICT;

CREATE TABLE bounces (
    message_ref TEXT PRIMARY KEY NOT NULL,
    outbox_id   INTEGER NOT NULL,
    case_key    TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    status      TEXT NOT NULL,
    diagnostic  TEXT,
    remote_mta  TEXT,
    permanent   INTEGER NOT NULL CHECK (permanent IN (0, 1)),
    at          REAL NOT NULL
) STRICT;
CREATE INDEX bounces_outbox ON bounces (outbox_id);

CREATE TABLE suppressions (
    address     TEXT PRIMARY KEY NOT NULL,
    until       REAL NOT NULL,
    status      TEXT NOT NULL,
    case_key    TEXT NOT NULL,
    message_ref TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT;

ALTER TABLE thread RENAME TO thread_v2;

CREATE TABLE thread (
    pos      INTEGER PRIMARY KEY,
    case_key TEXT NOT NULL REFERENCES cases (key),
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL CHECK (kind IN ('contract.in', 'contract.out', 'delivery.failed', 'mail.bounced', 'mail.in', 'mail.out', 'mail.refused', 'status')),
    at       REAL NOT NULL,
    data     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    UNIQUE (case_key, seq)
) STRICT;

INSERT INTO thread (pos, case_key, seq, kind, at, data)
    SELECT pos, case_key, seq, kind, at, data FROM thread_v2 ORDER BY pos;

DROP TABLE thread_v2;
"""  # noqa: E501

#: The version of the migration :data:`ERASABLE` (on both backends).
ERASABLE_VERSION = 5

#: Migration 5, as released: a case can be erased, leaving one ``case.erased`` entry.
#:
#: The entry stays in the feed after its case's row is gone, so ``thread``
#: loses its foreign key to ``cases`` (the store removes a case's entries
#: itself, :mod:`masd.store.retention`) and its kinds take ``case.erased``.
#: SQLite changes neither with ``ALTER TABLE``: the table is built anew
#: (create, copy, drop, rename), every entry at the position it had.  No
#: table refers to ``thread``, and no trigger, view or named index names it.
ERASABLE = """
CREATE TABLE thread_v5 (
    pos      INTEGER PRIMARY KEY,
    case_key TEXT NOT NULL,
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL CHECK (kind IN ('case.erased', 'contract.in', 'contract.out', 'delivery.failed', 'mail.bounced', 'mail.in', 'mail.out', 'mail.refused', 'status')),
    at       REAL NOT NULL,
    data     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    UNIQUE (case_key, seq)
) STRICT;

INSERT INTO thread_v5 (pos, case_key, seq, kind, at, data)
    SELECT pos, case_key, seq, kind, at, data FROM thread ORDER BY pos;

DROP TABLE thread;

ALTER TABLE thread_v5 RENAME TO thread;
"""  # noqa: E501

#: The version of the migration :data:`HOSTS_ADD_UP` (on both backends).
HOSTS_ADD_UP_VERSION = 6

#: Migration 6, as released: nothing changes on SQLite.  PostgreSQL's migration 6 gives
#: case numbers a sequence per type and thread entries their writer's transaction id (what
#: several hosts writing at once need); SQLite's one writer needs neither, and the version
#: is recorded so that a store's version means the same on either kind.
HOSTS_ADD_UP = "SELECT 1"

#: The version of the migration :data:`KEYED_TABLES` (on both backends).
KEYED_TABLES_VERSION = 7

#: Migration 7, as released: ``deliveries``, ``statuses`` and ``idempotency`` are kept in
#: their primary key's B-tree (``WITHOUT ROWID``).  Each is looked up and written by that
#: key only, so a row number gave every insert a second B-tree to write (a table page and
#: a key page): a delivery, a status and its answer each write one page fewer per commit.
#: Their rows are small, as such tables should be.  SQLite cannot change this with ``ALTER
#: TABLE``: each is built anew (create, copy, drop, rename) with its index.  No table
#: refers to them.  PostgreSQL has no row numbers: its migration 7 changes nothing.
KEYED_TABLES = """
CREATE TABLE deliveries_v7 (
    dedupe      TEXT PRIMARY KEY NOT NULL,
    message_ref TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT, WITHOUT ROWID;
INSERT INTO deliveries_v7 (dedupe, message_ref, at)
    SELECT dedupe, message_ref, at FROM deliveries;
DROP TABLE deliveries;
ALTER TABLE deliveries_v7 RENAME TO deliveries;
CREATE INDEX deliveries_at ON deliveries (at);

CREATE TABLE statuses_v7 (
    handoff_id TEXT NOT NULL REFERENCES handoffs (handoff_id),
    n          INTEGER NOT NULL CHECK (n >= 1),
    seq        INTEGER,
    status     TEXT NOT NULL CHECK (status IN ('requested', 'negotiating', 'scheduled', 'attempted', 'running', 'completed', 'failed', 'expired', 'refused', 'cancelled', 'timed-out')),
    source     TEXT NOT NULL CHECK (source IN ('email', 'mode', 'master')),
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    at         REAL NOT NULL,
    PRIMARY KEY (handoff_id, n)
) STRICT, WITHOUT ROWID;
INSERT INTO statuses_v7 (handoff_id, n, seq, status, source, data, at)
    SELECT handoff_id, n, seq, status, source, data, at FROM statuses;
DROP TABLE statuses;
ALTER TABLE statuses_v7 RENAME TO statuses;

CREATE TABLE idempotency_v7 (
    peer   TEXT NOT NULL,
    id     TEXT NOT NULL,
    status INTEGER NOT NULL,
    body   TEXT NOT NULL,
    at     REAL NOT NULL,
    PRIMARY KEY (peer, id)
) STRICT, WITHOUT ROWID;
INSERT INTO idempotency_v7 (peer, id, status, body, at)
    SELECT peer, id, status, body, at FROM idempotency;
DROP TABLE idempotency;
ALTER TABLE idempotency_v7 RENAME TO idempotency;
CREATE INDEX idempotency_at ON idempotency (at);
"""  # noqa: E501

#: The version of the migration :data:`THREAD_SEQ` (on both backends).
THREAD_SEQ_VERSION = 8

#: Migration 8, as released: a thread entry keeps its case's ``thread_seq`` itself.  An entry
#: is appended as one statement, its ``seq`` one past the case's (``INSERT … SELECT`` from
#: ``cases``, masd/store/thread.py), and this trigger moves ``thread_seq`` up to it: one
#: statement per entry instead of an ``UPDATE … RETURNING`` and an ``INSERT``.  ``MAX``:
#: an entry written with a ``seq`` of its own (a copy of a store, an erased case's last
#: entry) never moves the counter back, so no ``seq`` is given twice.
THREAD_SEQ = """
CREATE TRIGGER thread_seq_kept AFTER INSERT ON thread
BEGIN
    UPDATE cases SET thread_seq = MAX(thread_seq, NEW.seq) WHERE key = NEW.case_key;
END;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial", INITIAL),
    Migration(2, "read-side", READ_SIDE),
    Migration(3, "raw-last", RAW_LAST),
    Migration(4, "bounces", BOUNCES),
    Migration(ERASABLE_VERSION, "erasable", ERASABLE),
    Migration(HOSTS_ADD_UP_VERSION, "hosts-add-up", HOSTS_ADD_UP),
    Migration(KEYED_TABLES_VERSION, "keyed-tables", KEYED_TABLES),
    Migration(THREAD_SEQ_VERSION, "thread-seq", THREAD_SEQ),
)
