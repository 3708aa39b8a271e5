"""The PostgreSQL store: several masd hosts on one database (psycopg 3, psycopg_pool).

:class:`PgStore` answers what :class:`masd.store.Store` answers (``write``,
``read``, their ``_sync`` forms, ``check``, ``health``, ``stats``,
``close``) and runs the same store functions: a job gets a :class:`PgTx`,
whose ``execute`` takes the store's ``?`` text (:data:`POSTGRESQL`
translates it once per statement).

Writes.  SQLite has one writer, so its group commit makes every job see the
jobs before it.  Here any host may write at any time, so each job is one
transaction of its own, run on a pooled connection at ``SERIALIZABLE``
isolation: the database commits jobs as if one at a time, in commit order,
whichever host ran them.  A job that loses a race (serialization failure
``40001``, deadlock ``40P01``) is rolled back and run again from the start,
at most :data:`CONFLICT_RETRIES` times, with a short random pause; its
caller sees only the run that committed (a job must therefore keep its
effects inside the transaction: what it returns, wakes included, is acted on
by its caller after the commit, and the lines it logs are held until then,
:mod:`masd.store.deferred_logs`).  The caller is answered after ``COMMIT``
returned (``synchronous_commit`` is the server's: keep it ``on``).

What several hosts need, and where it comes from:

- dedupe and idempotency are unique keys written with ``INSERT ... ON
  CONFLICT``, never a look then an insert (the same statements as SQLite);
- case ids come from the ``id_counters`` row bumped by ``INSERT ... ON
  CONFLICT DO UPDATE ... RETURNING``: the row lock makes a second host wait
  for the first one's commit and then read its value, so no number is handed
  out twice;
- one case's inputs are applied one at a time: a write job that loads a case
  locks its row (``FOR UPDATE OF c``, :attr:`Dialect.lock_rows`), so a second
  job on that case waits for the first to commit;
- each deadline fires once: firing closes or moves the handoff row in the
  job that acts on it; two hosts doing so conflict and the second, run
  again, finds it done;
- the event feed cannot skip an event.  ``thread.pos`` is an identity
  column, and a sequence hands out numbers at insert time, not at commit: left
  alone, a transaction holding ``pos`` 7 could commit after one holding 8,
  and a reader that saw 8 would resume past 7 for ever.  So a transaction
  takes the advisory lock :data:`~masd.store.backend.FEED_LOCK` before its
  first thread insert (:func:`masd.store.thread.append_thread`) and holds it
  until it ends.  The server makes a commit visible before it releases the
  transaction's locks, so the next transaction gets the lock, and only then
  a number, after this one is visible: numbers are taken in commit order, and
  any snapshot that shows entry n+1 shows every entry below it.  (A rollback
  leaves a gap in the numbers, never an entry behind the cursor.)  The price:
  transactions that append to threads commit one after another, as every
  transaction does on SQLite.

Writers take turns.  Left to SERIALIZABLE alone, writers that touch the same
rows (every new case bumps its type's ``id_counters`` row; every job that
appends to a thread takes the feed lock) conflict, and under load the
losers lose again on every retry: eight LMTP sessions opening cases at once
made jobs fail after nine runs.  So a write job first takes the advisory lock
:data:`WRITE_LOCK` on its session, before its transaction (and so its
snapshot) begins, and lets go of it after the commit: across every host, one
write transaction runs at a time, as SQLite's one writer does, each seeing
every commit before it.  Conflicts are then left to what the lock does not
cover (none among masd's own jobs); the retry stays for them.  A host that
dies holds nothing: the lock is its session's.

Reads run ``READ ONLY`` at ``REPEATABLE READ``: one snapshot per call, never
waiting for the writers.

Faults.  :meth:`Dialect.classify` tells the server's faults (connection
refused or lost, admin shutdown, a read-only standby, disk full) from the
job's own errors; the first make the store unwritable
(:mod:`masd.store.health`) and every caller gets :class:`StoreError`
(``451 4.3.0``, ``503``) until a write commits again.  The pool reconnects by
itself; :meth:`check` probes with a write of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import random
import secrets
import socket
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Final, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from masd.store import deferred_logs
from masd.store.backend import POSTGRESQL, POSTGRESQL_READ, Cursor, Fault
from masd.store.files import StoreError
from masd.store.health import HEALTH_SECONDS, PROBE_SECONDS, HealthWatch, StoreHealth
from masd.store.readers import in_event_loop
from masd.store.sql import Tx
from masd.store.uri import shown_uri
from masd.store.writer import StoreStats

T = TypeVar("T")

#: A job that lost a race to another writer is run again at most this often.
CONFLICT_RETRIES: Final = 8
#: Connections per host; each runs one job or one read at a time.
POOL_SIZE: Final = 8
#: An outbox row a host took is another's to take after this long (``server.claim_timeout``).
CLAIM_TIMEOUT: Final = 30.0
#: Seconds a caller waits for a pooled connection before the store counts as unavailable.
CONNECT_TIMEOUT: Final = 5.0


#: Held by a write job from before its transaction begins until after it ends.
WRITE_LOCK: Final = 0x6D617364_77726974  # "masdwrit"
_WRITE_LOCK: Final = f"SELECT pg_advisory_lock({WRITE_LOCK})"
_WRITE_UNLOCK: Final = f"SELECT pg_advisory_unlock({WRITE_LOCK})"
_PROBE: Final = "SELECT pg_current_xact_id()"  # takes a transaction id: fails where nothing commits


def _reason(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} ({state})" if state else text


class PgTx:
    """A PostgreSQL transaction as the store's functions see it (:class:`masd.store.sql.Tx`)."""

    __slots__ = ("_conn", "masd_dialect")

    def __init__(self, conn: psycopg.Connection[Any], *, read: bool = False) -> None:
        self._conn = conn
        #: A read locks nothing (``FOR UPDATE`` is refused in a read-only transaction).
        self.masd_dialect = POSTGRESQL_READ if read else POSTGRESQL

    @property
    def conn(self) -> PgTx:
        return self

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        return self._conn.execute(POSTGRESQL.translate(sql), tuple(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(POSTGRESQL.translate(sql), [tuple(p) for p in parameters])

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A savepoint: an exception leaving the block undoes it alone."""
        with self._conn.transaction():
            yield


class PgStore:
    """masd's store on PostgreSQL: see the module docstring."""

    def __init__(
        self,
        uri: str,
        *,
        password: str | None = None,
        size: int = POOL_SIZE,
        claim_timeout: float = CLAIM_TIMEOUT,
        host: str | None = None,
    ) -> None:
        self._label = _redact(uri)
        #: How long an outbox row this host took stays its own (``server.claim_timeout``):
        #: past it, another host takes the row over (masd.store.outbox.claim).
        self.claim_seconds = claim_timeout
        #: This host's name on the rows it holds.
        self.host = host or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        kwargs: dict[str, Any] = {"autocommit": True}
        if password is not None:
            kwargs["password"] = password
        self._pool = ConnectionPool(
            uri,
            kwargs=kwargs,
            min_size=1,
            max_size=size,
            timeout=CONNECT_TIMEOUT,
            open=False,
            check=ConnectionPool.check_connection,
            name="masd",
        )
        self._pool.open(wait=False)
        self._workers = ThreadPoolExecutor(max_workers=size, thread_name_prefix="masd-pg")
        #: One thread runs this host's write jobs, in the order they were submitted (as
        #: SQLite's writer does: the recipients of one mail open their cases in order);
        #: writes take turns across hosts anyway (:data:`WRITE_LOCK`).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="masd-pg-write")
        self._health = HealthWatch(self._label)
        self._closed = False
        self._stats = StoreStats()
        self._lock = threading.Lock()
        self.conflicts = 0  # runs rolled back by a race with another writer
        deferred_logs.install()

    @classmethod
    def open(
        cls,
        uri: str,
        *,
        password: str | None = None,
        migrate: bool = True,
        claim_timeout: float = CLAIM_TIMEOUT,
    ) -> PgStore:
        """Migrate (or, with ``migrate=False``, check) the database's schema, then open.

        The schema is :mod:`masd.store.pg_schema`'s, applied by :mod:`masd.store.pg_admin`.
        """
        try:
            admin: Any = importlib.import_module("masd.store.pg_admin")
        except ImportError as exc:
            raise StoreError(
                f"cannot open store {_redact(uri)}: no PostgreSQL schema: {exc}"
            ) from exc
        if migrate:
            admin.migrate(uri, password)
        else:
            with admin.connect(uri, password) as conn:
                current, latest = admin.version(uri, conn), admin.MIGRATIONS[-1].version
            if current < latest:
                raise StoreError(
                    f"store {_redact(uri)} is at schema version {current}, this masd needs "
                    f"{latest}: run masd db migrate"
                )
        return cls(uri, password=password, claim_timeout=claim_timeout)

    @property
    def path(self) -> str:
        return self._label

    @property
    def health(self) -> StoreHealth:
        return self._health.current

    @property
    def stats(self) -> StoreStats:
        with self._lock:
            return replace(self._stats, faults=self._health.faults)

    # -- running ----------------------------------------------------------------

    def _count(self, *, failed: bool) -> None:
        with self._lock:
            s = self._stats
            self._stats = replace(
                s,
                batches=s.batches + 1,
                jobs=s.jobs + 1,
                failed_jobs=s.failed_jobs + failed,
                largest_batch=1,
            )

    def _attempt(self, fn: Callable[[Tx], T], *, read: bool) -> T:
        """One run of ``fn``; its log lines are emitted once it committed
        (:mod:`masd.store.deferred_logs`: a run rolled back leaves none)."""
        with deferred_logs.held() as records:
            value = self._transaction(fn, read=read)
        deferred_logs.release(records)
        return value

    def _transaction(self, fn: Callable[[Tx], T], *, read: bool) -> T:
        with self._pool.connection() as conn:
            if read:
                return self._in_transaction(conn, fn, read=True)
            # Every host's writers take turns (the module docstring says why): the
            # lock is the session's, taken before the transaction's snapshot exists.
            conn.execute(_WRITE_LOCK)
            try:
                return self._in_transaction(conn, fn, read=False)
            finally:
                with contextlib.suppress(psycopg.Error):  # a lost session holds nothing
                    conn.execute(_WRITE_UNLOCK)

    @staticmethod
    def _in_transaction(conn: psycopg.Connection[Any], fn: Callable[[Tx], T], *, read: bool) -> T:
        with conn.transaction():
            if read:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            else:
                conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            value = fn(PgTx(conn, read=read))
            if isinstance(value, types.GeneratorType | psycopg.Cursor):
                raise StoreError(
                    f"store job returned a lazy {type(value).__name__}; return a list instead"
                )
            return value

    def _run(self, fn: Callable[[Tx], T], *, read: bool = False) -> T:
        """Run ``fn`` in a transaction of its own; again after a conflict (module docstring)."""
        what = "read" if read else "write"
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                value = self._attempt(fn, read=read)
            except Exception as exc:
                fault = POSTGRESQL.classify(exc)
                if fault is Fault.CONFLICT and attempt < CONFLICT_RETRIES:
                    with self._lock:
                        self.conflicts += 1
                    time.sleep(random.uniform(0, 0.002 * 2**attempt))
                    continue
                if not read:
                    self._count(failed=True)
                if fault is Fault.UNAVAILABLE:
                    if not read:
                        self._health.transaction(_reason(exc))
                    raise StoreError(f"store {self._label}: {what} failed: {_reason(exc)}") from exc
                if fault is Fault.CONFLICT:
                    raise StoreError(
                        f"store {self._label}: {what} lost {CONFLICT_RETRIES + 1} races with "
                        f"other writers: {_reason(exc)}"
                    ) from exc
                if isinstance(exc, psycopg.Error):
                    raise StoreError(f"store job failed: {_reason(exc)}") from exc
                raise
            if not read:
                self._count(failed=False)
                self._health.transaction(None)
            return value
        raise AssertionError("unreachable")  # pragma: no cover

    def _submit(self, fn: Callable[[Tx], T], *, read: bool) -> Any:
        if self._closed:
            raise StoreError(f"store {self._label} is closed")
        runner = self._workers if read else self._writer
        return runner.submit(self._run, fn, read=read)

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a transaction of its own; its result once committed."""
        result: T = await asyncio.wrap_future(self._submit(fn, read=False))
        return result

    def write_sync(self, fn: Callable[[Tx], T]) -> T:
        if in_event_loop():
            raise StoreError("write_sync called on a running event loop; use await write()")
        result: T = self._submit(fn, read=False).result()
        return result

    async def read(self, fn: Callable[[Tx], T]) -> T:
        result: T = await asyncio.wrap_future(self._submit(fn, read=True))
        return result

    def read_sync(self, fn: Callable[[Tx], T]) -> T:
        if in_event_loop():
            raise StoreError("read_sync called on a running event loop; use await read()")
        result: T = self._submit(fn, read=True).result()
        return result

    async def check(self, max_age: float = HEALTH_SECONDS) -> StoreHealth:
        """Can the store commit?  The last verdict while recent, else a probe write."""
        if self._closed:
            raise StoreError(f"store {self._label} is closed")
        health = self._health.current
        age = time.monotonic() - health.checked
        if age < (max_age if health.writable else PROBE_SECONDS):
            return health
        with contextlib.suppress(StoreError):
            await self.write(_probe)
        return self._health.current

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.shutdown(wait=True)
        self._workers.shutdown(wait=True)
        self._pool.close()

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _probe(tx: Tx) -> None:
    tx.execute(_PROBE)  # type: ignore[attr-defined]


_redact = shown_uri  # ``uri`` without a password, with its ports, for errors and the log
