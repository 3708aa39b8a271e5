"""The SQLite store: one writer thread with group commit, WAL readers.

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
import queue
import sqlite3
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlite_utils import Database

from masd.store.files import StoreError, apply_pending, backup, check_version, migrate
from masd.store.files import connect as _connect
from masd.store.files import database as _database
from masd.store.files import reason as _reason
from masd.store.health import HEALTH_SECONDS, HealthWatch, StoreHealth, fault_of, probe
from masd.store.health import rewrite_header as _rewrite_header
from masd.store.schema import MIGRATIONS
from masd.store.sql import Tx

__all__ = [
    "CHECKPOINT_SECONDS",
    "MAX_BATCH",
    "WAL_LIMIT_BYTES",
    "Store",
    "StoreError",
    "StoreHealth",
    "StoreStats",
    "backup",
    "migrate",
]

T = TypeVar("T")

MAX_BATCH = 256
READERS = 4
CHECKPOINT_SECONDS = 1.0
#: A WAL past this size is restarted (and truncated back to it), not only copied.
WAL_LIMIT_BYTES = 64 * 1024 * 1024

_JOB_SAVEPOINT = "masd_job"
# The writer's own transaction statements carry a marker so that SQL text a
# job might use (a bare "COMMIT") never hits the writer's cached, already
# authorized statement: the authorizer only runs when a statement is prepared.
_BEGIN = "BEGIN IMMEDIATE /* masd writer */"
_COMMIT = "COMMIT /* masd writer */"
_ROLLBACK = "ROLLBACK /* masd writer */"
_SAVEPOINT = f"SAVEPOINT {_JOB_SAVEPOINT} /* masd writer */"
_RELEASE = f"RELEASE {_JOB_SAVEPOINT} /* masd writer */"
_ROLLBACK_TO = f"ROLLBACK TO {_JOB_SAVEPOINT} /* masd writer */"
# Settings a job may not change: they would weaken the batch it shares
# (deferred foreign keys fail the whole COMMIT) or the store's guarantees.
_FROZEN_PRAGMAS = frozenset(
    {
        "defer_foreign_keys",
        "foreign_keys",
        "ignore_check_constraints",
        "journal_mode",
        "locking_mode",
        "query_only",
        "synchronous",
        "temp_store",
        "writable_schema",
    }
)


@dataclass(frozen=True)
class StoreStats:
    """Counters of the writer since the store was opened."""

    batches: int = 0  # transactions committed or attempted
    jobs: int = 0  # jobs run
    failed_jobs: int = 0  # jobs whose caller got an exception
    failed_batches: int = 0  # transactions lost at BEGIN, COMMIT or by SQLite
    largest_batch: int = 0
    faults: int = 0  # times the store stopped accepting writes
    reopens: int = 0  # write connections replaced while recovering


@dataclass(frozen=True)
class _Outcome:
    value: object = None
    error: BaseException | None = None


class _Job:
    __slots__ = ("_settle", "fn", "settled")

    def __init__(self, fn: Callable[[Tx], object], settle: Callable[[_Outcome], None]) -> None:
        self.fn = fn
        self._settle = settle
        self.settled = False

    def settle(self, out: _Outcome) -> None:
        if not self.settled:
            self.settled = True
            self._settle(out)


_STOP = object()


# -- the store ----------------------------------------------------------------


def _settle_future(fut: asyncio.Future[Any], out: _Outcome) -> None:
    if fut.done():  # the awaiting coroutine was cancelled: nobody to answer
        return
    if out.error is not None:
        fut.set_exception(out.error)
    else:
        fut.set_result(out.value)


def _as_caller_error(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.Error):
        reason = _reason(exc)
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_AUTH":
            reason += (
                "; a job may not BEGIN, COMMIT, ROLLBACK, release the writer's savepoint"
                " or change store PRAGMAs"
            )
        err = StoreError(f"store job failed: {reason}")
        err.__cause__ = exc
        return err
    return exc


def _open_writer(path: Path, factory: type[sqlite3.Connection] | None) -> sqlite3.Connection:
    """A connection that writes (the writer's, the checkpointer's)."""
    return _connect(path) if factory is None else _connect(path, factory=factory)


def _probe_job(tx: Tx) -> None:
    """``GET /healthz``'s write, in a batch like any job (see :meth:`Store.check`)."""
    _rewrite_header(cast(Database, tx).conn)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
        self._wal_limit = wal_limit_bytes
        self._checkpoint_seconds = checkpoint_seconds
        self._factory = factory
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._in_job = False
        self._stats = StoreStats()
        self._stats_lock = threading.Lock()
        self._health = HealthWatch(path)
        self._batch_fault: str | None = None  # the store's fault in the batch being run
        self._generation = 0  # times every connection was closed to recover (_reopen)
        self._conn: sqlite3.Connection | None = self._prepare(conn)
        self._db: Database | None = _database(conn)
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_conn: sqlite3.Connection | None = _open_writer(path, factory)
        self._checkpoint_stop = threading.Event()
        self._restart_wal = threading.Event()  # the checkpointer asks the writer
        self._checkpointer = threading.Thread(
            target=self._checkpoints, name="masd-checkpoint", daemon=True
        )
        self._checkpointer.start()
        self._readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="masd-read")
        self._idle_readers: list[Database] = []  # at most one per reader thread
        self._thread = threading.Thread(target=self._run, name="masd-writer", daemon=True)
        self._thread.start()

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
        conn = _open_writer(p, factory)
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
        with self._stats_lock:
            stats = self._stats
        return replace(stats, faults=self._health.faults, reopens=self._health.reopened)

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
            await self.write(_probe_job)
        return self._health.current

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self._path} is closed")
            self._queue.put(job)

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in the writer; return its result once durably committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(out: _Outcome) -> None:
            # A closed loop has nobody left to answer; the job ran regardless.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle_future, fut, out)

        self._submit(_Job(fn, settle))
        return await fut

    def write_sync(self, fn: Callable[[Tx], T]) -> T:
        """Like :meth:`write`, for plain threads; blocks until committed."""
        if threading.current_thread() is self._thread:
            raise StoreError("write_sync called from inside a store job (would deadlock)")
        if _in_event_loop():
            raise StoreError("write_sync called on a running event loop; use await write()")
        done = threading.Event()
        box: list[_Outcome] = []

        def settle(out: _Outcome) -> None:
            box.append(out)
            done.set()

        self._submit(_Job(fn, settle))
        done.wait()
        if box[0].error is not None:
            raise box[0].error
        return cast(T, box[0].value)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        # Jobs share the writer's transaction: they may not end it, touch the
        # savepoint that isolates them from each other, or change settings.
        if self._in_job and (
            action == sqlite3.SQLITE_TRANSACTION
            or (action == sqlite3.SQLITE_SAVEPOINT and arg2 == _JOB_SAVEPOINT)
            or (
                action == sqlite3.SQLITE_PRAGMA
                and arg2 is not None
                and (arg1 or "").lower() in _FROZEN_PRAGMAS
            )
        ):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _run(self) -> None:
        stopping = False
        while not stopping:
            try:
                # Blocks while writable; while not, wakes up to probe.
                item = self._queue.get(timeout=self._health.next_probe_in())
            except queue.Empty:
                self._recover()
                continue
            batch, stopping = self._take_batch(item)
            if batch:
                self._serve(batch)
            if self._restart_wal.is_set() and self._conn is not None:
                self._restart_wal.clear()
                # Between batches the writer holds no transaction, so the
                # RESTART waits for no writer, only for readers to move on.
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()

    def _take_batch(self, item: object) -> tuple[list[_Job], bool]:
        """``item`` and every job waiting behind it (at most MAX_BATCH); True: stop after."""
        batch: list[_Job] = []
        while True:
            if item is _STOP:
                return batch, True
            batch.append(cast(_Job, item))
            if len(batch) >= MAX_BATCH:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False

    def _serve(self, batch: list[_Job]) -> None:
        if self._health.next_probe_in() == 0.0:
            self._recover()  # the batch then runs on the connection that is left
        if self._conn is None or self._db is None:
            self._refuse(batch, f"no connection: {self._health.current.detail}")
            return
        try:
            self._run_batch(batch, self._conn, self._db)
        except Exception as exc:  # noqa: BLE001 - a writer fault: answer everyone, go on
            self._abandon()
            self._refuse(batch, f"writer fault: {_reason(exc)}")

    def _refuse(self, batch: list[_Job], why: str) -> None:
        """Answer every job of ``batch`` with StoreError: the store's fault, not theirs."""
        self._health.transaction(why)
        err = StoreError(f"store {self._path}: {why}")
        for job in batch:
            with contextlib.suppress(Exception):
                job.settle(_Outcome(error=err))

    def _run_batch(self, batch: list[_Job], conn: sqlite3.Connection, db: Database) -> None:
        outcomes: list[_Outcome] = []
        start = 0
        self._batch_fault = None
        while start < len(batch):
            done = self._transaction(conn, db, batch, start, outcomes)
            start += done
        # Before anyone is answered: a caller told of a fault finds the store unwritable.
        self._health.transaction(self._batch_fault)
        for job, out in zip(batch, outcomes, strict=True):
            job.settle(out)
        with self._stats_lock:
            self._stats = replace(
                self._stats,
                jobs=self._stats.jobs + len(batch),
                failed_jobs=self._stats.failed_jobs
                + sum(out.error is not None for out in outcomes),
                largest_batch=max(self._stats.largest_batch, len(batch)),
            )

    def _count_batch(self, *, failed: bool) -> None:
        with self._stats_lock:
            self._stats = replace(
                self._stats,
                batches=self._stats.batches + 1,
                failed_batches=self._stats.failed_batches + failed,
            )

    def _transaction(
        self,
        conn: sqlite3.Connection,
        db: Database,
        batch: list[_Job],
        start: int,
        outcomes: list[_Outcome],
    ) -> int:
        """Run jobs from ``batch[start]`` in one transaction; return how many it consumed.

        Normally it consumes the rest of the batch.  If SQLite drops the
        transaction under a job, the jobs run so far (that one included) get
        StoreError and the caller starts a new transaction for the rest.
        """
        try:
            conn.execute(_BEGIN)
        except sqlite3.Error as exc:
            self._count_batch(failed=True)
            self._batch_fault = _reason(exc)
            err = StoreError(f"store {self._path}: cannot begin a transaction: {_reason(exc)}")
            outcomes.extend(_Outcome(error=err) for _ in batch[start:])
            return len(batch) - start
        mine: list[_Outcome] = []
        for job in batch[start:]:
            try:
                mine.append(self._run_job(conn, db, job))
            except sqlite3.Error as exc:
                # The transaction is gone or unusable (I/O error, disk full,
                # a savepoint that cannot be released): undo it all.
                self._abandon()
                self._count_batch(failed=True)
                self._batch_fault = _reason(exc)
                err = StoreError(f"store {self._path}: transaction lost: {_reason(exc)}")
                outcomes.extend(_Outcome(error=err) for _ in range(len(mine) + 1))
                return len(mine) + 1
        try:
            conn.execute(_COMMIT)
        except sqlite3.Error as exc:
            self._abandon()
            self._count_batch(failed=True)
            self._batch_fault = _reason(exc)
            err = StoreError(f"store {self._path}: commit failed: {_reason(exc)}")
            outcomes.extend(_Outcome(error=err) for _ in mine)
            return len(mine)
        self._count_batch(failed=False)
        outcomes.extend(mine)
        return len(mine)

    def _abandon(self) -> None:
        if self._conn is not None and self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute(_ROLLBACK)

    def _run_job(self, conn: sqlite3.Connection, db: Database, job: _Job) -> _Outcome:
        """Run one job in its savepoint.  Raises sqlite3.Error only if the
        transaction itself is lost; the job's own failures become its outcome."""
        conn.execute(_SAVEPOINT)
        self._in_job = True
        try:
            value = job.fn(db)
            if isinstance(value, types.GeneratorType | sqlite3.Cursor):
                raise StoreError(
                    f"store job {getattr(job.fn, '__qualname__', job.fn)!r} returned a lazy "
                    f"{type(value).__name__}; return a list instead"
                )
        except BaseException as exc:  # handed to the job's caller
            self._in_job = False
            if not conn.in_transaction:
                raise sqlite3.OperationalError(f"transaction rolled back by SQLite: {exc}") from exc
            conn.execute(_ROLLBACK_TO)
            conn.execute(_RELEASE)
            # A write refused by the store (read-only, disk full) fails the
            # statement, not always the transaction: still the store's fault.
            self._batch_fault = self._batch_fault or fault_of(exc)
            return _Outcome(error=_as_caller_error(exc))
        self._in_job = False
        if not conn.in_transaction:
            raise sqlite3.OperationalError("transaction ended inside a job")
        conn.execute(_RELEASE)
        return _Outcome(value=value)

    # -- recovering -------------------------------------------------------------

    def _prepare(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """Make ``conn`` the writer's: no automatic checkpoints, the job authorizer."""
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(f"PRAGMA journal_size_limit={int(self._wal_limit)}")
        conn.set_authorizer(self._authorize)
        return conn

    def _recover(self) -> None:
        """Probe the writer's connection; failing that, open every connection again."""
        fault = "no connection" if self._conn is None else probe(self._conn)
        reopened = False
        if fault is not None:
            fault = self._reopen()
            reopened = fault is None
        self._health.probed(fault, reopened=reopened)

    def _reopen(self) -> str | None:
        """Close the store's connections, open the writer's again and probe it.

        SQLite shares one wal-index per database file among the connections
        of a process: once one opened it read-only, a new connection writes
        only after every one of them is closed.  Readers and the checkpointer
        open theirs again when next needed (a read in flight closes its own
        when done, and may delay this until the next probe).
        """
        with self._lock:
            self._generation += 1
            idle, self._idle_readers = self._idle_readers, []
        # The checkpointer waits until the writer's connection is open again.
        with self._checkpoint_lock:
            closing = [*(db.conn for db in idle), self._checkpoint_conn, self._conn]
            self._checkpoint_conn = self._conn = self._db = None
            for conn in closing:
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
            try:
                conn = self._prepare(_open_writer(self._path, self._factory))
            except (StoreError, sqlite3.Error) as exc:
                return exc.detail if isinstance(exc, StoreError) else _reason(exc)
            self._conn, self._db = conn, _database(conn)
        return probe(conn)

    # -- reading --------------------------------------------------------------

    def _checkout(self) -> tuple[Database, int]:
        """An idle reader connection, or a new one; and the generation it belongs to."""
        with self._lock:
            generation = self._generation
            if self._idle_readers:
                return self._idle_readers.pop(), generation
        return _database(_connect(self._path, query_only=True)), generation

    def _checkin(self, db: Database, generation: int) -> None:
        with self._lock:
            if not self._closed and generation == self._generation:
                self._idle_readers.append(db)
                return
        db.conn.close()  # the store reopened (or closed) meanwhile

    def _run_read(self, fn: Callable[[Tx], T]) -> T:
        try:
            db, generation = self._checkout()
        except StoreError as exc:
            raise StoreError(f"store {self._path}: read failed: {exc.detail}") from exc
        conn = db.conn
        try:
            conn.execute("BEGIN")
            try:
                value = fn(db)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise StoreError(f"store {self._path}: read failed: {_reason(exc)}") from exc
        finally:
            self._checkin(db, generation)
        if isinstance(value, types.GeneratorType | sqlite3.Cursor):
            raise StoreError(f"store read returned a lazy {type(value).__name__}; return a list")
        return value

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` on a reader thread inside one read transaction."""
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self._path} is closed")
            cf = self._readers.submit(self._run_read, fn)
        return await asyncio.wrap_future(cf)

    def read_sync(self, fn: Callable[[Tx], T]) -> T:
        """Like :meth:`read`, for plain threads."""
        if _in_event_loop():
            raise StoreError("read_sync called on a running event loop; use await read()")
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self._path} is closed")
            cf = self._readers.submit(self._run_read, fn)
        return cf.result()

    # -- closing --------------------------------------------------------------

    def _checkpoints(self) -> None:
        """Copy the WAL into the database beside the writer (see the module docstring)."""
        while not self._checkpoint_stop.wait(self._checkpoint_seconds):
            with self._checkpoint_lock:
                try:
                    if self._checkpoint_conn is None:  # closed by the writer to recover
                        self._checkpoint_conn = _open_writer(self._path, self._factory)
                    self._checkpoint(self._checkpoint_conn)
                except (sqlite3.Error, OSError, StoreError):
                    # Busy or failing now; the WAL keeps everything and the next
                    # round tries again (the last connection to close checkpoints too).
                    continue

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        # PASSIVE copies what it can without holding anyone up.  Under steady
        # writes the log never catches up, so SQLite never starts it over and
        # it only grows: past the limit the writer runs a RESTART between two
        # batches (from here it would wait for a gap between commits that may
        # never come), which right after this PASSIVE one has only the last
        # frames to copy.
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames * page_size > self._wal_limit:
            self._restart_wal.set()

    def close(self) -> None:
        """Refuse new work, run every job already submitted, then close."""
        if threading.current_thread() is self._thread:
            raise StoreError("close called from inside a store job (would deadlock)")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()
        self._checkpoint_stop.set()
        self._checkpointer.join()
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
        self._readers.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()
        with self._lock:
            idle, self._idle_readers = self._idle_readers, []
        for db in idle:
            db.conn.close()
