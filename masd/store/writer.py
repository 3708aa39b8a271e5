"""The store's writer: one thread, one connection, group commit (see :mod:`masd.store.db`).

The writer takes every job waiting in its queue, runs them in one SQLite
transaction, each in its own savepoint, commits once and only then answers
their callers.  It also owns the store's fault probe: a transaction that
fails for a reason of the store's makes it unwritable, and the writer then
probes (:func:`masd.store.health.probe`) until a write commits again,
reopening every connection of the store if its own cannot
(:meth:`Writer._reopen`, with the reader pool and the checkpointer).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlite_utils import Database

from masd.store.checkpointer import Checkpointer, open_writer
from masd.store.files import StoreError
from masd.store.files import database as _database
from masd.store.files import reason as _reason
from masd.store.health import HealthWatch, fault_of, probe, rewrite_header
from masd.store.readers import ReaderPool, in_event_loop
from masd.store.sql import Tx

T = TypeVar("T")

MAX_BATCH = 256

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


def probe_job(tx: Tx) -> None:
    """``GET /healthz``'s write, in a batch like any job (see :meth:`masd.store.Store.check`)."""
    rewrite_header(cast(Database, tx).conn)


class Writer:
    """The writer thread and its connection (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        conn: sqlite3.Connection,
        *,
        wal_limit_bytes: int,
        factory: type[sqlite3.Connection] | None,
        health: HealthWatch,
        readers: ReaderPool,
        checkpointer: Checkpointer,
    ) -> None:
        self._path = path
        self._wal_limit = wal_limit_bytes
        self._factory = factory
        self._health = health
        self._readers = readers
        self._checkpointer = checkpointer
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._in_job = False
        # Plain counters, written by the writer alone and read under the lock:
        # a StoreStats is built when asked for, not for every batch.
        self._counts = [0, 0, 0, 0, 0]  # batches, jobs, failed jobs, failed batches, largest
        self._stats_lock = threading.Lock()
        self._batch_fault: str | None = None  # the store's fault in the batch being run
        self._conn: sqlite3.Connection | None = self._prepare(conn)
        self._db: Database | None = _database(conn)
        self._thread = threading.Thread(target=self._run, name="masd-writer", daemon=True)
        self._thread.start()

    @property
    def stats(self) -> StoreStats:
        with self._stats_lock:
            batches, jobs, failed_jobs, failed_batches, largest = self._counts
        return StoreStats(
            batches=batches,
            jobs=jobs,
            failed_jobs=failed_jobs,
            failed_batches=failed_batches,
            largest_batch=largest,
        )

    def in_writer(self) -> bool:
        """Whether the calling thread is the writer's (a job calling back into the store)."""
        return threading.current_thread() is self._thread

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
        if in_event_loop():
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
            # A job done is let go before the wait for the next: what it holds
            # (a whole mail, for a delivery) is not kept until then.
            del item, batch
            if self._checkpointer.restart_wanted.is_set() and self._conn is not None:
                self._checkpointer.restart_wanted.clear()
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
        # Before anyone is answered: a caller told of a fault finds the store
        # unwritable, and one that reads the counters finds its job counted.
        self._health.transaction(self._batch_fault)
        failed = sum(out.error is not None for out in outcomes)
        with self._stats_lock:
            counts = self._counts
            counts[1] += len(batch)
            counts[2] += failed
            counts[4] = max(counts[4], len(batch))
        for job, out in zip(batch, outcomes, strict=True):
            job.settle(out)

    def _count_batch(self, *, failed: bool) -> None:
        with self._stats_lock:
            self._counts[0] += 1
            self._counts[3] += failed

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
        self._readers.drop()
        # The checkpointer waits until the writer's connection is open again.
        with self._checkpointer.hold():
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
            self._conn = self._db = None
            try:
                conn = self._prepare(open_writer(self._path, self._factory))
            except (StoreError, sqlite3.Error) as exc:
                return exc.detail if isinstance(exc, StoreError) else _reason(exc)
            self._conn, self._db = conn, _database(conn)
        return probe(conn)

    # -- closing --------------------------------------------------------------

    def stop(self) -> None:
        """Refuse new jobs, run every job already submitted, end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    def close(self) -> None:
        """Close the connection (after :meth:`stop`)."""
        if self._conn is not None:
            self._conn.close()
