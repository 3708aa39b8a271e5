"""masd's durable state: SQLite in WAL mode, one writer thread with group commit.

This package is masd's data-access layer: every SQL statement of masd is in
it, and nothing outside it touches the database but through it.  A store job
(:meth:`Store.write`, :meth:`Store.read`) is handed a :class:`Tx`, which it
passes to the functions of one module per aggregate:

- :mod:`~masd.store.cases`: cases, their ids, policy and send counts;
- :mod:`~masd.store.messages`: recorded mails, delivery dedupe, slave intakes;
- :mod:`~masd.store.thread`: each case's thread;
- :mod:`~masd.store.handoffs`: handoffs, statuses, deadlines;
- :mod:`~masd.store.outbox`: what waits to go out;
- :mod:`~masd.store.idempotency`: answers kept per (peer, id);
- :mod:`~masd.store.bounces`: the bounce secret, bounces received, suppressed addresses;
- :mod:`~masd.store.purge`, :mod:`~masd.store.gauges`, :mod:`~masd.store.reads`,
  :mod:`~masd.store.entries`, :mod:`~masd.store.message_reads`: housekeeping, ``/metrics``
  and the read side (a mail's bytes by range, the intakes, what one master may list);
- :mod:`~masd.store.queue_rows`: the outbox as an operator lists and steers it;
- :mod:`~masd.store.probe`: what ``masd doctor`` reads, on its own connection.

The store's functions are written once against :mod:`masd.store.backend` (a
connection protocol, each database's few differences, which driver errors are
the store's); :mod:`masd.store.pg_backend` runs them on PostgreSQL, for a store
several hosts share (:func:`open_store` picks the backend from
``server.database``; the driver is imported only for PostgreSQL).  Both follow
:class:`~masd.store.handle.StoreHandle`, which is what the rest of masd holds.

Timestamps in every table are REAL epoch seconds (UTC); JSON columns are TEXT.
See :mod:`masd.store.schema` for the tables, :mod:`masd.store.db` for the
write/read model, :mod:`masd.store.health` for what happens when the store
cannot commit, and :mod:`masd.store.files` for opening, migrating and backing
up the file.

PostgreSQL (a store several hosts share): :mod:`masd.store.pg_schema` holds its
migrations, :mod:`masd.store.pg_admin` connects to and migrates a database, and
:mod:`masd.store.copy` copies a whole store between the two kinds.  These import
psycopg (the ``postgresql`` extra) and are not imported here.
"""

from masd.core.kinds import THREAD_KINDS
from masd.store import (
    cases,
    gauges,
    handoffs,
    idempotency,
    messages,
    outbox,
    purge,
    reads,
    thread,
)
from masd.store.cases import next_number
from masd.store.db import (
    MAX_BATCH,
    Store,
    StoreError,
    StoreHealth,
    StoreStats,
    backup,
    migrate,
    open_store,
)
from masd.store.handle import StoreHandle
from masd.store.outbox import OutboxItem
from masd.store.schema import MIGRATIONS, Migration
from masd.store.sql import Tx, dumps, savepoint
from masd.store.thread import append_thread

__all__ = [
    "MAX_BATCH",
    "MIGRATIONS",
    "THREAD_KINDS",
    "Migration",
    "OutboxItem",
    "Store",
    "StoreError",
    "StoreHandle",
    "StoreHealth",
    "StoreStats",
    "Tx",
    "append_thread",
    "backup",
    "cases",
    "dumps",
    "gauges",
    "handoffs",
    "idempotency",
    "messages",
    "migrate",
    "next_number",
    "open_store",
    "outbox",
    "purge",
    "reads",
    "savepoint",
    "thread",
]
