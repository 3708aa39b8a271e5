"""The store's file: opening a connection to it, migrating its schema, backing it up.

:mod:`masd.store.db` runs the store on the connections opened here; ``masd db
migrate`` and ``masd db backup`` use :func:`migrate` and :func:`backup`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sqlite_utils import Database

from masd.core.errors import MasdError
from masd.store.schema import MIGRATIONS, Migration

BUSY_TIMEOUT_MS = 5000
MIN_SQLITE = (3, 37, 0)  # STRICT tables (3.37), RETURNING (3.35)


class StoreError(MasdError):
    """The store cannot do what was asked: edges answer ``451 4.3.0`` / 5xx."""

    code = "store-unavailable"


def reason(exc: BaseException) -> str:
    """An exception as errors and the log show it: its text and SQLite's name for it."""
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


def _private_copy(dest: Path, owner: Path) -> Path:
    """A new empty file beside ``dest`` under a random name, created exclusively
    (never one somebody made in advance), mode 0600, owned by whoever owns
    ``owner`` (masd's user, when root runs the backup)."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        if os.geteuid() == 0:
            st = os.stat(owner)
            os.fchown(fd, st.st_uid, st.st_gid)
    finally:
        os.close(fd)
    return Path(name)


def connect(
    path: Path,
    *,
    query_only: bool = False,
    factory: type[sqlite3.Connection] = sqlite3.Connection,
) -> sqlite3.Connection:
    """Open one connection with masd's PRAGMAs; any failure is a StoreError.

    ``factory``: the connection class (:meth:`masd.store.Store.open` explains it)."""
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
            str(path),
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
            factory=factory,
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
        raise StoreError(f"cannot open store {path}: {reason(exc)}") from exc
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn


def database(conn: sqlite3.Connection) -> Database:
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


def check_version(path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]) -> int:
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


def apply_pending(
    path: Path, conn: sqlite3.Connection, migrations: Sequence[Migration]
) -> list[str]:
    """Apply each pending migration in its own transaction; return their names."""
    _check_registry(migrations)
    db = database(conn)
    applied: list[str] = []
    for m in migrations:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot migrate store {path}: {reason(exc)}") from exc
        try:
            # Checked again inside the write lock: another process may have
            # migrated between our look and our BEGIN.
            if m.version <= check_version(path, conn, migrations):
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
                    f"migration {m.version} ({m.name}) failed on store {path}: {reason(exc)}"
                ) from exc
            raise
        applied.append(m.name)
    return applied


def migrate(path: str | Path, *, migrations: Sequence[Migration] = MIGRATIONS) -> list[str]:
    """Apply pending migrations to the database at ``path``; return the names applied."""
    p = Path(path)
    conn = connect(p)
    try:
        return apply_pending(p, conn, migrations)
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
    src = connect(src_path, query_only=True)
    tmp: Path | None = None  # ours to remove if the copy fails
    try:
        tmp = _private_copy(dest_path, owner=src_path)
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
        for leftover in () if tmp is None else (tmp, tmp.with_name(tmp.name + "-journal")):
            with contextlib.suppress(OSError):
                leftover.unlink()
        raise StoreError(f"cannot back up store {src_path} to {dest_path}: {reason(exc)}") from exc
    finally:
        src.close()
