"""The PostgreSQL store: several masd hosts on one database (psycopg 3, greenlet).

:class:`PgStore` answers what :class:`masd.store.Store` answers (``write``,
``read``, their ``_sync`` forms, ``check``, ``health``, ``stats``,
``close``) and runs the same store functions: a job gets a :class:`PgTx`,
whose ``execute`` takes the store's ``?`` text (numbered once per statement text,
:func:`masd.store.backend.numbered`).

Writes.  SQLite has one writer, so its group commit makes every job see the
jobs before it.  Here any host may write at any time, and each host runs
:data:`WRITERS` write jobs at once, each one transaction of its own on a
connection of its own at ``READ COMMITTED``: no lock spans the store, and jobs on
different cases commit side by side, on one host and across hosts.  What
keeps them apart is each job's own rows:

- one case's inputs are applied one at a time: a write job that loads a case
  locks its row first, by a statement of its own (``SELECT ... FOR UPDATE``,
  :func:`masd.store.cases.load`), so a second job on that case waits for the
  first to commit, and its next statement sees what the first wrote;
- dedupe and idempotency are unique keys written with ``INSERT ... ON
  CONFLICT``, never a look then an insert (the same statements as SQLite); a
  key taken by a concurrent twin, or by the same mail delivered before, makes
  the job run again (:class:`~masd.store.backend.Raced`), and it then finds the
  row and answers as the duplicate it is (a delivery looks for its key only in
  that second run, :func:`masd.store.messages.looks_first`); a plain unique
  violation (``23505``, two hosts opening one slave case) is run again the same
  way, at most :data:`UNIQUE_RETRIES` times before it counts as the job's own
  error;
- case numbers come from a sequence per (domain, type)
  (:func:`masd.store.cases.next_number`, PostgreSQL migration 6): taking one
  waits for nobody's commit, and a job that rolls back leaves a gap;
- each deadline fires once and each outbox row is sent by one host: the job
  that acts on a handoff locks its case, and outbox rows are claimed with
  ``FOR UPDATE SKIP LOCKED`` under a lease (:func:`masd.store.outbox.claim`).

A job that loses a race (deadlock ``40P01``, serialization failure ``40001``,
:class:`~masd.store.backend.Raced`) is rolled back and run again from the
start, at most :data:`CONFLICT_RETRIES` times, with a short random pause; its
caller sees only the run that committed (a job must therefore keep its
effects inside the transaction: what it returns, wakes included, is acted on
by its caller after the commit, and the lines it logs are held until then,
:mod:`masd.store.deferred_logs`).  The caller is answered after ``COMMIT``
returned (``synchronous_commit`` is the server's: keep it ``on``).

The feed by a high-water mark.  A sequence hands out numbers at insert time,
not at commit: with positions from one, a transaction holding ``pos`` 7 could
commit after one holding 8, and a reader that saw 8 would resume past 7 for
ever.  So each thread entry carries its writer's transaction id
(``thread.xid``, ``pg_current_xact_id()``) and its position is made from it
(``masd_thread_pos``: the id times 2^20 plus the entry's place in its
transaction), and the feed's queries read only entries whose writer's id is
below the oldest transaction still running in the reader's snapshot
(``pg_snapshot_xmin(pg_current_snapshot())``,
:meth:`~masd.store.backend.Dialect.readable`).  Every transaction that could
still write an earlier position has a smaller id, and is then no longer open;
a transaction not yet given an id gets a larger one.  So a reader sees entry
*n* only with every entry below it that will ever commit, and two readers on
any hosts read one order.  The wait this adds is bounded by the longest write
transaction on the server (of any database of its cluster: the oldest running
id is the server's).  One case's entries must also follow its order: an entry
written by a job whose id is older than that of the case's latest entry (it
took its id before it waited for the case's row) makes the job run again,
with a newer id (:func:`masd.store.thread.append_thread`).  Outbox ids are
identity values too: a sender that follows new rows by id may pass one whose
transaction committed late, so each host looks every second at due queue
heads no host took (:func:`masd.store.outbox.orphaned_queues`).

Round trips.  A write job runs in libpq's pipeline mode
(:mod:`masd.store.pg_pipeline`, on psycopg's ``pq`` binding and its adapters,
without a cursor per statement): a statement whose result the job does not
read (:func:`masd.store.sql.send`) goes out with the next one it reads,
``BEGIN`` with the first and ``COMMIT`` with the last; each statement text is
prepared once per connection, its ``Parse`` sent with its first run, and a
connection is pinged only after :data:`CHECK_IDLE_SECONDS` idle (one found lost
before its ``COMMIT`` was sent runs the job again on another).

Where jobs run.  A job runs on the event loop's thread, as a job of
:mod:`masd.store.pg_loop`: where it waits for the server's answer it suspends,
and the loop serves the other sessions and jobs meanwhile, so that a host
runs its jobs side by side with no thread per job (no thread switch at its
start and end, no thread woken at each answer).  Its connection is lent by
:mod:`masd.store.pg_conns` (:data:`WRITERS` for writes, :data:`POOL_SIZE`
for reads).  A job, once begun, runs to its commit or rollback even if its
caller stops waiting.  The ``_sync`` forms, for plain threads (the command
line), run the same job on an event loop of their own.

Reads run ``READ ONLY`` at ``REPEATABLE READ``: one snapshot per call, never
waiting for the writers.

Faults.  :meth:`Dialect.classify` tells the server's faults (connection
refused or lost, admin shutdown, a read-only standby, disk full) from the
job's own errors; the first make the store unwritable
(:mod:`masd.store.health`) and every caller gets :class:`StoreError`
(``451 4.3.0``, ``503``) until a write commits again.  A connection lost is
closed, and the next job that needs one opens a new one; :meth:`check` probes
with a write of its own.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

import psycopg

from masd.store import deferred_logs
from masd.store.backend import POSTGRESQL, POSTGRESQL_READ, Cursor, Fault
from masd.store.files import StoreError
from masd.store.health import HEALTH_SECONDS, PROBE_SECONDS, HealthWatch, StoreHealth
from masd.store.pg_conns import Connections
from masd.store.pg_loop import spawn, wait_socket
from masd.store.pg_pipeline import Result, Transaction, ping
from masd.store.readers import in_event_loop
from masd.store.sql import Tx
from masd.store.uri import shown_uri
from masd.store.writer import StoreStats

T = TypeVar("T")

#: A job that lost a race to another writer is run again at most this often.
CONFLICT_RETRIES: Final = 8
#: A job that hit a unique key taken by a concurrent twin is run again at most this often.
UNIQUE_RETRIES: Final = 2
#: Connections per host for reads; each runs one read at a time.
POOL_SIZE: Final = 8
#: Write jobs one host runs at once, each on a connection of its own.  Intake shares them
#: with the outbox (a claim and a record per message sent): with the database 1 ms away, 8
#: LMTP sessions waited for 8 writers (docs/performance.md).  A host opens at most
#: ``WRITERS + POOL_SIZE`` connections.
WRITERS: Final = 16
#: An outbox row a host took is another's to take after this long (``server.claim_timeout``).
CLAIM_TIMEOUT: Final = 30.0
#: Seconds a job waits for a free connection before the store counts as unavailable:
#: with the database down, a delivery is answered ``451`` within about this long.
CONNECT_TIMEOUT: Final = 3.0
#: A connection idle longer than this is pinged before a job gets it.
CHECK_IDLE_SECONDS: Final = 2.0
#: libpq's own limit on opening a connection (seconds; libpq takes 2 at least).
LIBPQ_CONNECT_TIMEOUT: Final = 2

_PROBE: Final = "SELECT pg_current_xact_id()"  # takes a transaction id: fails where nothing commits
_UNIQUE: Final = "23505"
_BEGIN: Final = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def _reason(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} ({state})" if state else text


class _Lost(Exception):
    """The job's connection was lost before it committed anything: run it again."""


class PgTx:
    """A PostgreSQL transaction as the store's functions see it (:class:`masd.store.sql.Tx`).

    Its statements go to libpq's pipeline (:class:`~masd.store.pg_pipeline.Transaction`):
    a statement whose result nobody reads (an ``INSERT``, an ``UPDATE`` whose count is not
    asked) goes out with the next one that is read, in one round trip, and ``COMMIT`` with
    the last of them."""

    __slots__ = ("_pipe", "masd_cache", "masd_dialect", "masd_lease", "masd_rerun")

    def __init__(
        self,
        pipe: Transaction,
        *,
        read: bool = False,
        cache: dict[str, object] | None = None,
        rerun: bool = False,
        lease: tuple[str, float, float] | None = None,
    ) -> None:
        self._pipe = pipe
        #: This host, its lease's length, and when the job began (:func:`masd.store.sql.lease`).
        self.masd_lease = lease
        #: What never changes once committed (the bounce secret), read once per store.
        self.masd_cache = cache
        #: The job runs again after a race (:func:`masd.store.sql.rerun`).
        self.masd_rerun = rerun
        #: A read locks nothing (``FOR UPDATE`` is refused in a read-only transaction).
        self.masd_dialect = POSTGRESQL_READ if read else POSTGRESQL

    @property
    def conn(self) -> PgTx:
        return self

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        return self._pipe.execute(sql, tuple(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> None:
        self._pipe.executemany(sql, parameters)

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """A savepoint: an exception leaving the block undoes it alone (what the block sent
        is answered before it ends, so its errors are its own)."""
        return self._pipe.savepoint()


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
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": LIBPQ_CONNECT_TIMEOUT,
            # The jobs' statements are prepared by masd.store.pg_pipeline; psycopg's own
            # cursors (migrations) would prepare theirs in a round trip of their own.
            "prepare_threshold": None,
        }
        if password is not None:
            kwargs["password"] = password

        def opener() -> psycopg.Connection[Any]:
            return psycopg.Connection.connect(uri, **kwargs)

        self._reads = Connections(opener, size, timeout=CONNECT_TIMEOUT, label=self._label)
        self._writes = Connections(opener, WRITERS, timeout=CONNECT_TIMEOUT, label=self._label)
        #: Write jobs submitted together may run in any order (:data:`WRITERS` at once).
        self.concurrent_writes = True
        self._cache: dict[str, object] = {}
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

    async def _attempt(self, fn: Callable[[Tx], T], *, read: bool, rerun: bool) -> T:
        """One run of ``fn`` (``rerun``: after one rolled back) on a connection of its own, as
        a job of the event loop (:mod:`masd.store.pg_loop`)."""
        conns = self._reads if read else self._writes
        conn = await self._connection(conns)
        try:
            return await spawn(self._transaction, conn, fn, read, rerun)
        finally:
            conns.put(conn)

    @staticmethod
    async def _connection(conns: Connections) -> psycopg.Connection[Any]:
        """A connection to run a job on; one idle long enough to have been dropped (a server
        restarted, a firewall's idle timeout) is pinged first, and closed if it fails."""
        while True:
            conn, idle = await conns.get()
            if idle <= CHECK_IDLE_SECONDS:
                return conn
            try:
                await spawn(ping, conn, wait_socket)
            except psycopg.Error:
                conns.put(conn)  # broken: closed, and its place freed
                continue
            return conn

    def _transaction(
        self, conn: psycopg.Connection[Any], fn: Callable[[Tx], T], read: bool, rerun: bool
    ) -> T:
        """``fn`` in one transaction on ``conn``; its log lines are emitted once it committed
        (:mod:`masd.store.deferred_logs`: a run rolled back leaves none)."""
        ran = False  # the job ran to its end: COMMIT is sent as the block ends
        lease = (self.host, self.claim_seconds, time.monotonic())
        try:
            # BEGIN and COMMIT as statements of the pipeline (an error of a statement whose
            # result was not read is raised at the next read or at COMMIT): a transaction
            # block would wait for the server at both ends.  Leaving the block on an
            # exception rolls back.
            with (
                deferred_logs.held() as records,
                Transaction(conn, _BEGIN_READ if read else _BEGIN, wait_socket) as pipe,
            ):
                tx = PgTx(pipe, read=read, cache=self._cache, rerun=rerun, lease=lease)
                value = self._checked(fn(tx))
                ran = True
                pipe.commit()
        except psycopg.OperationalError as exc:
            # A connection that was lost before its COMMIT was sent committed nothing: the
            # job is run again on another (idle connections are pinged only after a while).
            if not ran and conn.broken:
                raise _Lost(str(exc)) from exc
            raise
        deferred_logs.release(records)
        return value

    @staticmethod
    def _checked(value: T) -> T:
        if isinstance(value, types.GeneratorType | Result):
            raise StoreError(
                f"store job returned a lazy {type(value).__name__}; return a list instead"
            )
        return value

    async def _run(self, fn: Callable[[Tx], T], *, read: bool = False) -> T:
        """Run ``fn`` in a transaction of its own; again after a conflict (module docstring)."""
        what = "read" if read else "write"
        lost = 0
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                value = await self._attempt(fn, read=read, rerun=attempt > 0)
            except _Lost as exc:
                lost += 1
                if lost <= 1:
                    continue
                cause = exc.__cause__ or exc  # the driver's own error
                if not read:
                    self._count(failed=True)
                    self._health.transaction(_reason(cause))
                raise StoreError(f"store {self._label}: {what} failed: {_reason(cause)}") from cause
            except Exception as exc:
                fault = POSTGRESQL.classify(exc)
                if getattr(exc, "sqlstate", None) == _UNIQUE and attempt < UNIQUE_RETRIES:
                    fault = Fault.CONFLICT  # a concurrent twin's key: run again to find it
                if fault is Fault.CONFLICT and attempt < CONFLICT_RETRIES:
                    with self._lock:
                        self.conflicts += 1
                    await asyncio.sleep(random.uniform(0, 0.002 * 2**attempt))
                    continue
                failure = self._failure(exc, fault, read=read)
                if failure is exc:
                    raise  # the job's own error, as it raised it
                raise failure from exc
            if not read:
                self._count(failed=False)
                self._health.transaction(None)
            return value
        raise AssertionError("unreachable")  # pragma: no cover

    def _failure(self, exc: Exception, fault: Fault | None, *, read: bool) -> Exception:
        """What the caller of a job that failed for good gets raised: ``exc`` itself where
        it is the job's own error."""
        what = "read" if read else "write"
        if not read:
            self._count(failed=True)
        if fault is Fault.UNAVAILABLE:
            if not read:
                self._health.transaction(_reason(exc))
            return StoreError(f"store {self._label}: {what} failed: {_reason(exc)}")
        if fault is Fault.CONFLICT:
            return StoreError(
                f"store {self._label}: {what} lost {CONFLICT_RETRIES + 1} races with "
                f"other writers: {_reason(exc)}"
            )
        if isinstance(exc, psycopg.Error):
            return StoreError(f"store job failed: {_reason(exc)}")
        return exc

    async def _job(self, fn: Callable[[Tx], T], *, read: bool) -> T:
        """``fn`` run to its end even if its caller stops waiting (a job, once begun, commits
        or rolls back as it would have; so did a job on a thread of its own)."""
        if self._closed:
            raise StoreError(f"store {self._label} is closed")
        return await asyncio.shield(asyncio.ensure_future(self._run(fn, read=read)))

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a transaction of its own; its result once committed."""
        return await self._job(fn, read=False)

    def write_sync(self, fn: Callable[[Tx], T]) -> T:
        """:meth:`write` for a plain thread (its own event loop for the call)."""
        if in_event_loop():
            raise StoreError("write_sync called on a running event loop; use await write()")
        return asyncio.run(self._job(fn, read=False))

    async def read(self, fn: Callable[[Tx], T]) -> T:
        return await self._job(fn, read=True)

    def read_sync(self, fn: Callable[[Tx], T]) -> T:
        """:meth:`read` for a plain thread (its own event loop for the call)."""
        if in_event_loop():
            raise StoreError("read_sync called on a running event loop; use await read()")
        return asyncio.run(self._job(fn, read=True))

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
        self._reads.close()
        self._writes.close()

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _probe(tx: Tx) -> None:
    tx.execute(_PROBE)  # type: ignore[attr-defined]


_redact = shown_uri  # ``uri`` without a password, with its ports, for errors and the log
