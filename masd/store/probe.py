"""What ``masd doctor`` reads from the store: whether it can be written, recent messages.

The store is opened on its own connection, never created or migrated here
(a missing file is a finding, not something to fix), and every check is a
rolled-back transaction: the doctor changes nothing.  A PostgreSQL store
(several hosts, one database) is checked the same way through
:func:`masd.store.open_store`: opened without migrating (pending migrations
are a finding), a transaction that takes a transaction id (it fails where the
server cannot commit: down, a standby), and the same read of recent messages.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote

from masd.core.errors import MasdError
from masd.store.sql import Tx, dialect, tuples

#: How long a check waits for masd's writer to let go of the store.
BUSY_TIMEOUT_MS: Final = 5000
#: The header part read of each message: enough for any header block masd's
#: trust rules read (its Authentication-Results sit at the top).
HEADER_OCTETS: Final = 65536

T = TypeVar("T")


class DoctorStoreError(MasdError):
    """The store cannot be opened, read or written (the message says which and why)."""

    code = "store"


@dataclass(frozen=True)
class RecentMessage:
    """One recorded message, as the trust check needs it."""

    message_ref: str
    received_at: float
    dmarc: str | None  # the verdict masd recorded (auth.dmarc)
    authserv_id: str | None  # the trusted A-R it came from, or None
    mail_from: str  # the envelope sender (event.mail_from)
    rcpt_to: str  # the envelope recipient (event.rcpt_to)
    head: bytes  # the first HEADER_OCTETS of the raw message


def open_problem(database: object) -> str | None:
    """Why masd could not open ``database`` now, or None: an SQLite file in a directory that
    does not exist (masd creates the file, not its directory) or that cannot be opened; a
    PostgreSQL server that refuses the connection or the login.  Nothing is created or
    changed; an SQLite file not there yet in a directory that is, is fine."""
    if isinstance(database, Path):
        if not database.exists() and not database.parent.is_dir():
            return _no_directory(database)
        if not database.exists():
            return None
        try:
            db = _connect(database)
        except DoctorStoreError as exc:
            return exc.detail
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            return f"cannot open {database}: {exc}"
        finally:
            db.close()
        return None
    from masd.store.files import StoreError

    try:
        from masd.store.pg_admin import connect
    except ImportError as exc:  # masd installed without its extra "postgresql"
        return f"{exc}: install masd with its extra, pip install 'masd[postgresql]'"
    try:
        with connect(str(getattr(database, "uri", database)), getattr(database, "password", None)):
            return None
    except StoreError as exc:
        return exc.detail


def _no_directory(database: Path) -> str:
    return (
        f"{database}: its directory {database.parent} does not exist, so masd cannot create "
        "the store there (create it, owned by the user masd runs as)"
    )


def _connect(database: Path) -> sqlite3.Connection:
    if not database.exists() and not database.parent.is_dir():
        raise DoctorStoreError(_no_directory(database))
    if not database.exists():
        raise DoctorStoreError(f"{database} does not exist (masd creates it when it starts)")
    try:
        # The path quoted: a "#" or "?" in it would end the file name of the URI.
        uri = f"file:{quote(str(database.absolute()))}?mode=rw"
        db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot open {database}: {exc}") from exc
    db.isolation_level = None  # transactions are begun explicitly below
    return db


def check_writable(database: object) -> None:
    """Take the store's write lock and give it back (``BEGIN IMMEDIATE``, ``ROLLBACK``);
    on PostgreSQL, a transaction id taken and the transaction ended."""
    if not isinstance(database, Path):
        _on_postgres(database, lambda tx: tuples(tx, "SELECT pg_current_xact_id()"), write=True)
        return
    db = _connect(database)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot write {database}: {exc}") from exc
    finally:
        db.close()


def recent_messages(database: object, limit: int) -> list[RecentMessage]:
    """The ``limit`` most recently received messages, newest first."""
    if not isinstance(database, Path):
        rows = _on_postgres(database, lambda tx: _recent(tx, limit), write=False)
        return [_recent_message(*row) for row in rows]
    db = _connect(database)
    try:
        rows = db.execute(
            "SELECT message_ref, received_at, json_extract(event, '$.auth.dmarc'), "
            "json_extract(event, '$.auth.authserv_id'), json_extract(event, '$.mail_from'), "
            "json_extract(event, '$.rcpt_to'), substr(raw, 1, ?) "
            "FROM messages ORDER BY received_at DESC LIMIT ?",
            (HEADER_OCTETS, limit),
        ).fetchall()
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot read the messages of {database}: {exc}") from exc
    finally:
        db.close()
    return [_recent_message(*row) for row in rows]


def _recent_message(
    ref: object,
    at: float,
    dmarc: str | None,
    sid: str | None,
    frm: str | None,
    to: str | None,
    head: bytes,
) -> RecentMessage:
    return RecentMessage(
        str(ref), float(at), dmarc, sid, str(frm or ""), str(to or ""), bytes(head)
    )


def _recent(tx: Tx, limit: int) -> list[tuple[Any, ...]]:
    d = dialect(tx)
    return tuples(
        tx,
        f"SELECT message_ref, received_at, {d.json_get('event', 'auth', 'dmarc')}, "  # noqa: S608 - dialect words only
        f"{d.json_get('event', 'auth', 'authserv_id')}, {d.json_get('event', 'mail_from')}, "
        f"{d.json_get('event', 'rcpt_to')}, substr(raw, 1, ?) "
        "FROM messages ORDER BY received_at DESC LIMIT ?",
        (HEADER_OCTETS, limit),
    )


def _on_postgres(database: object, job: Callable[[Tx], T], *, write: bool) -> T:
    """``job`` on the PostgreSQL store ``database``, opened for this alone, never migrated."""
    from masd.store.db import open_store
    from masd.store.files import StoreError

    try:
        with open_store(database, migrate=False) as store:
            return store.write_sync(job) if write else store.read_sync(job)
    except StoreError as exc:
        what = "write" if write else "read the messages of"
        raise DoctorStoreError(f"cannot {what} {database}: {exc}") from exc


@dataclass(frozen=True)
class TableSize:
    """One table of the store: its rows, and its bytes (with its indexes) when cheap to tell."""

    name: str
    rows: int
    bytes: int | None


#: Below this size the store's pages are walked for each table's bytes (``dbstat``);
#: above it, only the rows are counted (walking every page of a large store is slow).
DBSTAT_MAX_BYTES: Final = 256 * 1024 * 1024


def table_sizes(database: Path) -> list[TableSize]:
    """Rows (and bytes, see :data:`DBSTAT_MAX_BYTES`) of every table of the store, by name."""
    db = _connect(database)
    try:
        names = [
            str(n)
            for (n,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        counts = {n: int(db.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0]) for n in names}  # noqa: S608 - names from the schema
        sizes: dict[str, int] = {}
        if database.stat().st_size <= DBSTAT_MAX_BYTES:
            try:
                sizes = {
                    str(t): int(b)
                    for t, b in db.execute(
                        "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d "
                        "JOIN sqlite_master m ON m.name = d.name GROUP BY m.tbl_name"
                    )
                }
            except sqlite3.Error:
                sizes = {}  # SQLite built without dbstat: rows only
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot count the tables of {database}: {exc}") from exc
    finally:
        db.close()
    return [TableSize(n, counts[n], sizes.get(n)) for n in names]
