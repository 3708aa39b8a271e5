"""The SQLite store: one writer thread with group commit, WAL readers.

:class:`Store` wires three parts, each in its module: the writer
(:mod:`masd.store.writer`: group commit and the fault probe), the reader
pool (:mod:`masd.store.readers`) and the checkpointer
(:mod:`masd.store.checkpointer`).  The queries they run are the store's
functions, written against :mod:`masd.store.backend`.

Durability rule: a caller is answered only after the transaction holding its
job is committed (``synchronous=FULL``, so the commit is on disk).

Writes.  A job is a plain function ``fn(tx) -> T`` (``tx``: a
:class:`~masd.store.sql.Tx`, which it hands to the store's functions) run
synchronously in the writer thread, which owns the only write connection.
The writer takes every job waiting in its queue (at most
:data:`MAX_BATCH`), opens ``BEGIN IMMEDIATE``, runs each job inside its own
``SAVEPOINT``, then issues one ``COMMIT`` (one fsync for the batch) and only
then answers every caller:

- a job that raises is rolled back to its savepoint alone; its caller gets
  the exception (``sqlite3`` errors wrapped in :class:`StoreError`), its
  batch-mates go on;
- if ``COMMIT`` fails, or SQLite drops the transaction after an error (disk
  full, I/O error), every job of that transaction is answered with
  :class:`StoreError` and none of its changes is visible;
- jobs may not end the transaction themselves: ``BEGIN``/``COMMIT``/
  ``ROLLBACK`` and touching the writer's savepoint are refused by an SQLite
  authorizer while a job runs (nested savepoints, e.g. ``db.atomic()``, are
  fine);
- a job must return a plain value, not a cursor or a generator over one (it
  would be read after the commit, outside the writer thread).

Cancellation.  Once :meth:`Store.write` has submitted a job, the job runs to
its end (committed or rolled back) whatever happens to the awaiting
coroutine; cancelling only stops waiting for the answer.  A write is never
half-run and never silently skipped, so an edge that loses its caller
(a dropped LMTP session, an HTTP client gone) leaves the store as if the
caller had waited; the peer's retry is then caught by deduplication or
idempotency.

Reads run on a small pool of threads, each with its own connection
(``query_only``), inside one read transaction per call, so a read sees one
consistent snapshot and never waits for the writer (WAL).

Checkpoints.  A commit never checkpoints (``wal_autocheckpoint=0``): a
checkpoint copies the WAL into the database file and syncs it, and done by
the committing connection it would hold every caller of that batch.  A
checkpointer thread with its own connection runs a ``PASSIVE`` checkpoint
every :data:`CHECKPOINT_SECONDS`, beside the writer.  Under steady writes
such a checkpoint never catches up, SQLite never starts the log over, and it
would grow without end; once it holds more than :data:`WAL_LIMIT_BYTES` the
writer runs a ``RESTART`` checkpoint between two batches.

Faults.  A transaction that fails for a reason of the store's (disk full,
read-only file or directory, I/O error, a lock held elsewhere), not of its
job's, makes the store *unwritable* (:mod:`masd.store.health`): its callers
get :class:`StoreError`, as every caller does while it lasts.  The writer
then probes every second with one small write of its own, on its connection
and, failing that, on a new one that replaces it once it commits (a
connection opened on a read-only file stays read-only), and the store is
writable again at the first commit: no restart.  :meth:`Store.check` answers
``GET /healthz``.  A job's own errors (a constraint, a bad statement) are
its caller's alone and say nothing of the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from masd.store.checkpointer import CHECKPOINT_SECONDS, Checkpointer, open_writer
from masd.store.files import StoreError, apply_pending, backup, check_version, migrate
from masd.store.health import HEALTH_SECONDS, HealthWatch, StoreHealth
from masd.store.readers import READERS, ReaderPool, in_event_loop
from masd.store.schema import MIGRATIONS
from masd.store.sql import Tx
from masd.store.writer import MAX_BATCH, StoreStats, Writer, probe_job

__all__ = [
    "CHECKPOINT_SECONDS",
    "MAX_BATCH",
    "READERS",
    "WAL_LIMIT_BYTES",
    "Store",
    "StoreError",
    "StoreHealth",
    "StoreStats",
    "backup",
    "migrate",
    "open_store",
]

if TYPE_CHECKING:
    from masd.store.pg_backend import PgStore

T = TypeVar("T")

#: A WAL past this size is restarted (and truncated back to it), not only copied.
WAL_LIMIT_BYTES = 64 * 1024 * 1024


def open_store(
    database: object, *, migrate: bool = True, claim_timeout: float = 30.0
) -> Store | PgStore:
    """``server.database`` opened: a path is an SQLite file (:class:`Store`); a
    ``postgresql://`` URI, or a value with ``uri`` and ``password`` (the configuration's),
    a database several hosts share (:class:`masd.store.pg_backend.PgStore`, whose
    driver is imported only then)."""
    uri = getattr(database, "uri", None)
    if uri is None and isinstance(database, str) and database.startswith(_PG_SCHEMES):
        uri = database
    if uri is None:
        if not isinstance(database, str | Path):
            raise StoreError(f"cannot open store {database!r}: neither a path nor a URI")
        return Store.open(database, migrate=migrate)
    from masd.store.pg_backend import PgStore

    password = getattr(database, "password", None)
    return PgStore.open(str(uri), password=password, migrate=migrate, claim_timeout=claim_timeout)


_PG_SCHEMES = ("postgresql://", "postgres://")


class Store:
    """The masd database: see the module docstring for the write/read model."""

    def __init__(
        self,
        path: Path,
        conn: sqlite3.Connection,
        *,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        factory: type[sqlite3.Connection] | None = None,
    ) -> None:
        # Use Store.open(); this only wires an already migrated connection.
        self._path = path
        self._closed = False
        self._health = HealthWatch(path)
        self._checkpointer = Checkpointer(
            path, wal_limit_bytes=wal_limit_bytes, seconds=checkpoint_seconds, factory=factory
        )
        self._readers = ReaderPool(path)
        self._writer = Writer(
            path,
            conn,
            wal_limit_bytes=wal_limit_bytes,
            factory=factory,
            health=self._health,
            readers=self._readers,
            checkpointer=self._checkpointer,
        )

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        migrate: bool = True,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        factory: type[sqlite3.Connection] | None = None,
    ) -> Store:
        """Open (creating the file, never its directory) and check or migrate the schema.

        With ``migrate=False`` the schema must already be current.  The WAL is
        started over once it holds more than ``wal_limit_bytes``; the
        checkpointer looks every ``checkpoint_seconds``.  A store that can be
        read but not written (a read-only file) opens, is found unwritable at
        its first write or :meth:`check`, and recovers by itself once it can
        be written; one with migrations pending does not open.

        ``factory``, the class of the connections that write (the writer's,
        the checkpointer's), is the seam for injecting faults in tests: a
        :class:`sqlite3.Connection` subclass whose ``execute`` raises.
        """
        p = Path(path)
        conn = open_writer(p, factory)
        try:
            if migrate:
                apply_pending(p, conn, MIGRATIONS)
            else:
                current = check_version(p, conn, MIGRATIONS)
                if current < MIGRATIONS[-1].version:
                    pending = [m.name for m in MIGRATIONS if m.version > current]
                    raise StoreError(
                        f"store {p} is at schema version {current}, this masd needs "
                        f"{MIGRATIONS[-1].version}: pending migrations {pending}"
                    )
            return cls(
                p,
                conn,
                wal_limit_bytes=wal_limit_bytes,
                checkpoint_seconds=checkpoint_seconds,
                factory=factory,
            )
        except BaseException:
            conn.close()
            raise

    @property
    def path(self) -> Path:
        return self._path

    @property
    def stats(self) -> StoreStats:
        return replace(
            self._writer.stats, faults=self._health.faults, reopens=self._health.reopened
        )

    @property
    def health(self) -> StoreHealth:
        """What the writer last found (no I/O): can the store commit?"""
        return self._health.current

    async def check(self, max_age: float = HEALTH_SECONDS) -> StoreHealth:
        """Can the store commit?  The last verdict if younger than ``max_age`` s
        (every transaction gives one; while unwritable the writer probes every
        second), else a small write to find out (``GET /healthz``).  A closed
        store raises :class:`StoreError`."""
        if self._closed:
            raise StoreError(f"store {self._path} is closed")
        health = self._health.current
        if not health.writable or time.monotonic() - health.checked < max_age:
            return health
        with contextlib.suppress(StoreError):
            await self.write(probe_job)
        return self._health.current

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing and reading ----------------------------------------------------

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in the writer; return its result once durably committed."""
        return await self._writer.write(fn)

    def write_sync(self, fn: Callable[[Tx], T]) -> T:
        """Like :meth:`write`, for plain threads; blocks until committed."""
        return self._writer.write_sync(fn)

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` on a reader thread inside one read transaction."""
        if self._closed:
            raise StoreError(f"store {self._path} is closed")
        return await asyncio.wrap_future(self._readers.submit(fn))

    def read_sync(self, fn: Callable[[Tx], T]) -> T:
        """Like :meth:`read`, for plain threads."""
        if in_event_loop():
            raise StoreError("read_sync called on a running event loop; use await read()")
        if self._closed:
            raise StoreError(f"store {self._path} is closed")
        return self._readers.submit(fn).result()

    # -- closing --------------------------------------------------------------

    def close(self) -> None:
        """Refuse new work, run every job already submitted, then close."""
        if self._writer.in_writer():
            raise StoreError("close called from inside a store job (would deadlock)")
        if self._closed:
            return
        self._closed = True
        self._writer.stop()
        self._checkpointer.close()
        self._readers.close()
        self._writer.close()
