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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
import types
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlite_utils import Database

from masd.core.errors import MasdError
from masd.store.schema import MIGRATIONS, Migration
from masd.store.sql import Tx

T = TypeVar("T")

MAX_BATCH = 256
READERS = 4
BUSY_TIMEOUT_MS = 5000
CHECKPOINT_SECONDS = 1.0
#: A WAL past this size is restarted (and truncated back to it), not only copied.
WAL_LIMIT_BYTES = 64 * 1024 * 1024
MIN_SQLITE = (3, 37, 0)  # STRICT tables (3.37), RETURNING (3.35)

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


class StoreError(MasdError):
    """The store cannot do what was asked: edges answer ``451 4.3.0`` / 5xx."""

    code = "store-unavailable"


@dataclass(frozen=True)
class StoreStats:
    """Counters of the writer since the store was opened."""

    batches: int = 0  # transactions committed or attempted
    jobs: int = 0  # jobs run
    failed_jobs: int = 0  # jobs whose caller got an exception
    failed_batches: int = 0  # transactions lost at BEGIN, COMMIT or by SQLite
    largest_batch: int = 0


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


def _reason(exc: BaseException) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return f"{exc} ({name})" if name else str(exc) or type(exc).__name__


#: Mode of a store file masd creates (the store, a backup): every case's mail, for
#: masd's user alone.  SQLite gives the -wal and -shm files the database file's mode.
FILE_MODE = 0o600


def _create_private(path: Path) -> None:
    """Create ``path`` empty with :data:`FILE_MODE`, unless it exists (SQLite takes an
    empty file for a new database)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))


def _connect(path: Path, *, query_only: bool = False) -> sqlite3.Connection:
    """Open one connection with masd's PRAGMAs; any failure is a StoreError."""
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise StoreError(
            f"SQLite {sqlite3.sqlite_version} is too old for {path}: "
            f"masd needs {'.'.join(map(str, MIN_SQLITE))} or newer"
        )
    parent = path.parent
    if not parent.is_dir():
        raise StoreError(f"cannot open store {path}: directory {parent} does not exist")
    conn: sqlite3.Connection | None = None
    try:
        if not query_only:
            _create_private(path)
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"cannot open store {path}: journal_mode is {mode!r}, not 'wal'")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        # Statement journals and sorts stay in memory: on disk each batch's
        # savepoints created, opened and unlinked a file in the temp directory
        # (five system calls and a journaled metadata change per commit).
        conn.execute("PRAGMA temp_store=MEMORY")
        if query_only:
            conn.execute("PRAGMA query_only=ON")
        # Reading the schema makes SQLite read the header: a file that is not
        # a database (or is damaged there) is refused here, not on first use.
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()
    except (sqlite3.Error, OSError) as exc:
        if conn is not None:
            conn.close()
        raise StoreError(f"cannot open store {path}: {_reason(exc)}") from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn


def _database(conn: sqlite3.Connection) -> Database:
    return Database(conn, execute_plugins=False)


# -- migrations ---------------------------------------------------------------


def _statements(sql: str) -> list[str]:
    """Split SQL text into complete statements (semicolons inside literals kept)."""
    out: list[str] = []
    buf = ""
    for piece in sql.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \t\r\n;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \t\r\n;"):
        out.append(buf.strip())
    return out


def _check_registry(migrations: Sequence[Migration]) -> None:
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise StoreError(f"migration registry: entry {i} has version {m.version}, expected {i}")


def _recorded(conn: sqlite3.Connection) -> dict[int, str]:
    row = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'masd_migrations'"
    ).fetchone()
    if row is None:
        return {}
    return {int(v): str(n) for v, n in conn.execute("SELECT version, name FROM masd_migrations")}


def _check_version(path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]) -> int:
    """Refuse a database this code does not understand; return its version."""
    recorded = _recorded(conn)
    known = migrations[-1].version if migrations else 0
    current = max(recorded, default=0)
    if current > known:
        raise StoreError(
            f"store {path} has schema version {current} ({recorded[current]!r}), "
            f"newer than version {known} this masd knows; upgrade masd"
        )
    for m in migrations:
        if m.version in recorded and recorded[m.version] != m.name:
            raise StoreError(
                f"store {path} records migration {m.version} as {recorded[m.version]!r}, "
                f"this masd knows it as {m.name!r}"
            )
    return current


def _apply_pending(
    path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]
) -> list[str]:
    """Apply each pending migration in its own transaction; return their names."""
    _check_registry(migrations)
    db = _database(conn)
    applied: list[str] = []
    for m in migrations:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot migrate store {path}: {_reason(exc)}") from exc
        try:
            # Checked again inside the write lock: another process may have
            # migrated between our look and our BEGIN.
            if m.version <= _check_version(path, conn, migrations):
                conn.execute("ROLLBACK")
                continue
            conn.execute(
                "CREATE TABLE IF NOT EXISTS masd_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            if isinstance(m.apply, str):
                for statement in _statements(m.apply):
                    conn.execute(statement)
            else:
                m.apply(db)
            conn.execute(
                "INSERT INTO masd_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (m.version, m.name, time.time()),
            )
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, Exception):
                raise StoreError(
                    f"migration {m.version} ({m.name}) failed on store {path}: {_reason(exc)}"
                ) from exc
            raise
        applied.append(m.name)
    return applied


def migrate(path: str | Path, *, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    """Apply pending migrations to the database at ``path``; return the names applied."""
    p = Path(path)
    conn = _connect(p)
    try:
        return _apply_pending(p, conn, migrations)
    finally:
        conn.close()


def backup(path: str | Path, dest: str | Path) -> None:
    """Copy a (possibly live) store to ``dest`` with SQLite's online backup API.

    The copy is written next to ``dest`` and renamed over it once complete
    and synced, so ``dest`` is never a half-written database.
    """
    src_path, dest_path = Path(path), Path(dest)
    if not src_path.is_file():
        raise StoreError(f"cannot back up store {src_path}: no such file")
    if not dest_path.parent.is_dir():
        raise StoreError(
            f"cannot back up store to {dest_path}: directory {dest_path.parent} does not exist"
        )
    tmp = dest_path.with_name(f".{dest_path.name}.{os.getpid()}.tmp")
    src = _connect(src_path, query_only=True)
    try:
        _create_private(tmp)
        dst = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
        finally:
            dst.close()
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest_path)
        dir_fd = os.open(dest_path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except (sqlite3.Error, OSError) as exc:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(OSError):
                leftover.unlink()
        raise StoreError(f"cannot back up store {src_path} to {dest_path}: {_reason(exc)}") from exc
    finally:
        src.close()


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
    ) -> None:
        # Use Store.open(); this only wires an already migrated connection.
        self._path = path
        self._wal_limit = wal_limit_bytes
        self._checkpoint_seconds = checkpoint_seconds
        self._conn = conn
        self._db = _database(conn)
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._in_job = False
        self._stats = StoreStats()
        self._stats_lock = threading.Lock()
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(f"PRAGMA journal_size_limit={int(wal_limit_bytes)}")
        conn.set_authorizer(self._authorize)
        self._checkpoint_conn = _connect(path)
        self._checkpoint_stop = threading.Event()
        self._restart_wal = threading.Event()  # the checkpointer asks the writer
        self._checkpointer = threading.Thread(
            target=self._checkpoints, name="masd-checkpoint", daemon=True
        )
        self._checkpointer.start()
        self._readers = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="masd-read")
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
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
    ) -> Store:
        """Open (creating the file, never its directory) and check or migrate the schema.

        With ``migrate=False`` the schema must already be current.  The WAL is
        started over once it holds more than ``wal_limit_bytes``; the
        checkpointer looks every ``checkpoint_seconds``.
        """
        p = Path(path)
        conn = _connect(p)
        try:
            if migrate:
                _apply_pending(p, conn, MIGRATIONS)
            else:
                current = _check_version(p, conn, MIGRATIONS)
                if current < MIGRATIONS[-1].version:
                    pending = [m.name for m in MIGRATIONS if m.version > current]
                    raise StoreError(
                        f"store {p} is at schema version {current}, this masd needs "
                        f"{MIGRATIONS[-1].version}: pending migrations {pending}"
                    )
            return cls(
                p, conn, wal_limit_bytes=wal_limit_bytes, checkpoint_seconds=checkpoint_seconds
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
            return self._stats

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
            item = self._queue.get()
            batch: list[_Job] = []
            while True:
                if item is _STOP:
                    stopping = True
                    break
                batch.append(cast(_Job, item))
                if len(batch) >= MAX_BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if not batch:
                continue
            try:
                self._run_batch(batch)
            except Exception as exc:  # noqa: BLE001 - a writer fault: answer everyone, go on
                self._abandon()
                err = StoreError(f"store {self._path}: writer fault: {_reason(exc)}")
                for job in batch:
                    with contextlib.suppress(Exception):
                        job.settle(_Outcome(error=err))
            if self._restart_wal.is_set():
                self._restart_wal.clear()
                # Between batches the writer holds no transaction, so the
                # RESTART waits for no writer, only for readers to move on.
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()

    def _run_batch(self, batch: list[_Job]) -> None:
        outcomes: list[_Outcome] = []
        start = 0
        while start < len(batch):
            done = self._transaction(batch, start, outcomes)
            start += done
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

    def _transaction(self, batch: list[_Job], start: int, outcomes: list[_Outcome]) -> int:
        """Run jobs from ``batch[start]`` in one transaction; return how many it consumed.

        Normally it consumes the rest of the batch.  If SQLite drops the
        transaction under a job, the jobs run so far (that one included) get
        StoreError and the caller starts a new transaction for the rest.
        """
        conn = self._conn
        try:
            conn.execute(_BEGIN)
        except sqlite3.Error as exc:
            self._count_batch(failed=True)
            err = StoreError(f"store {self._path}: cannot begin a transaction: {_reason(exc)}")
            outcomes.extend(_Outcome(error=err) for _ in batch[start:])
            return len(batch) - start
        mine: list[_Outcome] = []
        for job in batch[start:]:
            try:
                mine.append(self._run_job(job))
            except sqlite3.Error as exc:
                # The transaction is gone or unusable (I/O error, disk full,
                # a savepoint that cannot be released): undo it all.
                self._abandon()
                self._count_batch(failed=True)
                err = StoreError(f"store {self._path}: transaction lost: {_reason(exc)}")
                outcomes.extend(_Outcome(error=err) for _ in range(len(mine) + 1))
                return len(mine) + 1
        try:
            conn.execute(_COMMIT)
        except sqlite3.Error as exc:
            self._abandon()
            self._count_batch(failed=True)
            err = StoreError(f"store {self._path}: commit failed: {_reason(exc)}")
            outcomes.extend(_Outcome(error=err) for _ in mine)
            return len(mine)
        self._count_batch(failed=False)
        outcomes.extend(mine)
        return len(mine)

    def _abandon(self) -> None:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute(_ROLLBACK)

    def _run_job(self, job: _Job) -> _Outcome:
        """Run one job in its savepoint.  Raises sqlite3.Error only if the
        transaction itself is lost; the job's own failures become its outcome."""
        conn = self._conn
        conn.execute(_SAVEPOINT)
        self._in_job = True
        try:
            value = job.fn(self._db)
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
            return _Outcome(error=_as_caller_error(exc))
        self._in_job = False
        if not conn.in_transaction:
            raise sqlite3.OperationalError("transaction ended inside a job")
        conn.execute(_RELEASE)
        return _Outcome(value=value)

    # -- reading --------------------------------------------------------------

    def _reader(self) -> Database:
        db = getattr(self._reader_local, "db", None)
        if db is None:
            conn = _connect(self._path, query_only=True)
            with self._lock:
                self._reader_conns.append(conn)
            db = _database(conn)
            self._reader_local.db = db
        return cast(Database, db)

    def _run_read(self, fn: Callable[[Tx], T]) -> T:
        db = self._reader()
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
        conn = self._checkpoint_conn
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        while not self._checkpoint_stop.wait(self._checkpoint_seconds):
            try:
                # PASSIVE copies what it can without holding anyone up.  Under
                # steady writes the log never catches up, so SQLite never
                # starts it over and it only grows: past the limit the writer
                # runs a RESTART between two batches (from here it would wait
                # for a gap between commits that may never come), which right
                # after this PASSIVE one has only the last frames to copy.
                _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames * page_size > self._wal_limit:
                    self._restart_wal.set()
            except (sqlite3.Error, OSError):
                # Busy or failing now; the WAL keeps everything and the next
                # round tries again (the last connection to close checkpoints too).
                continue

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
        self._checkpoint_conn.close()
        self._readers.shutdown(wait=True)
        self._conn.close()
        for conn in self._reader_conns:
            conn.close()
