"""What a store backend provides, so that one set of queries serves SQLite and PostgreSQL.

The store's functions (:mod:`masd.store.cases`, :mod:`masd.store.outbox`, ...)
are written once, in the SQL the two databases share, against a transaction
handle (:class:`masd.store.sql.Tx`) whose connection follows
:class:`Connection`.  Where the two databases differ, a query asks the
:class:`Dialect` of its transaction (:func:`masd.store.sql.dialect`) for the
few words that differ; everything else is common text:

- placeholders: queries are written with ``?``, which SQLite takes as written;
  PostgreSQL's backend numbers them (``$1``, ``$2``...) once per statement text
  (:func:`numbered`), so no query is written twice;
- ``INSERT ... ON CONFLICT (...) DO NOTHING`` / ``DO UPDATE`` and
  ``RETURNING`` are spelt the same in both (SQLite 3.35+, PostgreSQL 9.5+):
  dedupe and idempotency are unique keys, never a look followed by an insert;
- ``LIMIT ? OFFSET ?`` and ``COALESCE`` are common too;
- what differs is given by :class:`Dialect`: reading a JSON member
  (:meth:`Dialect.json_get`), a JSON array parameter as a set of values
  (:meth:`Dialect.json_values`), index hints (SQLite's ``INDEXED BY``, nothing
  elsewhere), the current epoch time (:attr:`Dialect.now_epoch`), and
  whether write transactions lock what they read (:attr:`Dialect.lock_rows`,
  ``FOR UPDATE`` where several hosts write at once);
- outbox leases where several hosts send (:meth:`Dialect.unclaimed`,
  :meth:`Dialect.released`; :func:`masd.store.outbox.claim`);
- faults (:meth:`Dialect.classify`): which driver errors mean the store is
  unavailable (down, full, read-only: callers get ``StoreError``, LMTP
  ``451 4.3.0``, HTTP ``503``), which are a conflict with another writer
  that the backend retries, and which are the job's own error (a bug, a
  constraint) and say nothing of the store.

This module imports no driver: a dialect classifies by SQLite's result codes
and PostgreSQL's SQLSTATEs, which the errors carry.
"""

from __future__ import annotations

import enum
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Final, Protocol


class Cursor(Protocol):
    """What the store's functions use of a cursor (DB-API 2)."""

    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """What the store's functions use of a transaction's connection: ``?`` placeholders."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...


class Fault(enum.Enum):
    """What a driver error says of the store (:meth:`Dialect.classify`; None: of the job)."""

    #: The store cannot commit now (down, failing over, full, read-only, I/O error).
    UNAVAILABLE = "unavailable"
    #: Another writer got there first (serialization failure, deadlock): run it again.
    CONFLICT = "conflict"


class Raced(Exception):
    """A job found its unique key taken by a writer it could not see: run it again.

    Raised by a store function whose ``INSERT ... ON CONFLICT DO NOTHING`` inserted
    nothing (:func:`masd.store.idempotency.keep`): the job's other writes rest on a
    look that another host's commit made stale.  Where several hosts write it is a
    :attr:`Fault.CONFLICT` (the job is rolled back and run again, and then sees the
    other's row); with one writer it cannot happen.
    """


# -- SQLite -----------------------------------------------------------------------

#: Primary SQLite result codes that say the store, not the job, is at fault.
_SQLITE_FAULTS: Final = frozenset(
    {
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
        sqlite3.SQLITE_NOTADB,
    }
)


def _sqlite_fault(exc: BaseException) -> Fault | None:
    # One writer per file: a lock held elsewhere (BUSY) is another process on
    # the file, not a conflict to retry; nothing here is retried.
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or code & 0xFF not in _SQLITE_FAULTS:
        return None
    return Fault.UNAVAILABLE


# -- PostgreSQL -------------------------------------------------------------------

#: SQLSTATEs (or their two-character classes) that mean the server, not the job, is at fault.
_PG_UNAVAILABLE: Final = (
    "08",  # connection exception: refused, lost, failed over
    "53",  # insufficient resources: disk full, out of memory, too many connections
    "57P",  # operator intervention: admin/crash shutdown, cannot connect now
    "58",  # system error: I/O
    "25006",  # read-only SQL transaction: a standby, or default_transaction_read_only
    "XX",  # internal error, data corrupted
)
_PG_CONFLICT: Final = frozenset({"40001", "40P01"})  # serialization failure, deadlock
#: Driver errors without a SQLSTATE that mean no connection to the server.
_PG_LOST: Final = frozenset({"OperationalError", "InterfaceError"})


def _pg_fault(exc: BaseException) -> Fault | None:
    if isinstance(exc, Raced):
        return Fault.CONFLICT
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str) and state:
        if state in _PG_CONFLICT:
            return Fault.CONFLICT
        return Fault.UNAVAILABLE if state.startswith(_PG_UNAVAILABLE) else None
    # No SQLSTATE: the driver lost or never had a connection (none free in time,
    # masd.store.pg_conns); a job's own errors always carry one.
    if type(exc).__module__.startswith("psycopg") and type(exc).__name__ in _PG_LOST:
        return Fault.UNAVAILABLE
    return None


# -- the dialect ------------------------------------------------------------------

#: ``?`` outside quoted text (a placeholder), or a quoted text to keep as it is.
_QMARK = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?")


@lru_cache(maxsize=1024)
def numbered(sql: str) -> tuple[bytes, int]:
    """The store's ``?`` text with PostgreSQL's ``$1``, ``$2``... (a ``?`` in quoted text
    kept), encoded as libpq takes it, and how many placeholders it holds."""
    count = 0

    def swap(m: re.Match[str]) -> str:
        nonlocal count
        if m.group(0) != "?":
            return m.group(0)
        count += 1
        return f"${count}"

    return _QMARK.sub(swap, sql).encode(), count


@dataclass(frozen=True, eq=False)
class Dialect:
    """The few ways one database's SQL differs (see the module docstring).

    Compared and hashed by identity: each is a module constant, and the store's
    functions key their per-dialect statements on it at every call.
    """

    name: str
    #: The current time as REAL epoch seconds, in SQL.
    now_epoch: str
    #: Write transactions lock the rows they read to change (``FOR UPDATE``).
    lock_rows: bool
    #: Several hosts send from the outbox: rows carry leases (:meth:`unclaimed`).
    leases: bool
    #: Index hints are kept (SQLite's planner needs them on some queries).
    hints: bool
    #: The larger of two values, as a function name (SQLite's two-argument ``MAX``).
    greatest: str
    #: Which driver errors are the store's (:class:`Fault`); None: the job's own.
    classify: Callable[[BaseException], Fault | None]

    def json_get(self, column: str, *path: str) -> str:
        """The JSON member at ``path`` of text column ``column``: a number stays a number
        in SQLite; in PostgreSQL it is text (compare it with :meth:`json_int`)."""
        if self.name == "sqlite":
            return f"json_extract({column}, '$.{'.'.join(path)}')"
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')"

    def json_int(self, column: str, *path: str) -> str:
        """Like :meth:`json_get`, for a member that holds an integer."""
        if self.name == "sqlite":
            return self.json_get(column, *path)
        return f"({column}::jsonb #>> '{{{','.join(path)}}}')::bigint"

    def json_values(self) -> str:
        """A subquery over the values of one parameter, a JSON array of strings."""
        if self.name == "sqlite":
            return "(SELECT value FROM json_each(?))"
        return "(SELECT jsonb_array_elements_text(?::jsonb))"

    def row_order(self, key: str) -> str:
        """What orders a table's rows by insertion: SQLite's ``rowid``; elsewhere, the
        table's key ``key`` (a tie-break that is at least stable)."""
        return "rowid" if self.name == "sqlite" else key

    def param(self, type_: str) -> str:
        """A ``?`` whose type the database cannot infer (compared with NULL): cast to
        ``type_`` where the server must know it at PREPARE."""
        return "?" if self.name == "sqlite" else f"CAST(? AS {type_})"

    def nocase(self, column: str, param: str = "?") -> str:
        """``column`` equals ``param`` regardless of ASCII case."""
        if self.name == "sqlite":
            return f"{column} = {param} COLLATE NOCASE"
        return f"lower({column}) = lower({param})"

    def unclaimed(self, alias: str) -> str:
        """`` AND`` the outbox row ``alias`` is held by no other host's lease, where several
        hosts send (:func:`masd.store.outbox.claim`), with one ``?`` for this host's name;
        nothing where one host sends."""
        if not self.leases:
            return ""
        return (
            f" AND ({alias}.claimed_by IS NULL OR {alias}.claimed_by = ? "
            f"OR {alias}.claimed_until < {self.now_epoch})"
        )

    def released(self) -> str:
        """``, `` the columns that end a row's lease, where there are leases."""
        return ", claimed_by = NULL, claimed_until = NULL" if self.leases else ""

    def hint(self, hint: str) -> str:
        """``hint`` (``INDEXED BY x``, ``NOT INDEXED``) where the database has index hints."""
        return f" {hint} " if self.hints else " "

    def readable(self, alias: str) -> str:
        """`` AND`` the thread entry ``alias`` is below the feed's high-water mark, where
        several hosts write: its writer's transaction ended before the oldest one still
        running began, so no open transaction can write an earlier position
        (masd/store/pg_backend.py); nothing where one writer commits in order."""
        if self.name == "sqlite":
            return ""
        return f" AND {alias}.xid < pg_snapshot_xmin(pg_current_snapshot())"

    def for_update(self, of: str = "") -> str:
        """`` FOR UPDATE [OF of]`` where write transactions lock rows, else nothing."""
        if not self.lock_rows:
            return ""
        return f" FOR UPDATE OF {of}" if of else " FOR UPDATE"


SQLITE: Final = Dialect(
    name="sqlite",
    now_epoch="(julianday('now') - 2440587.5) * 86400.0",
    lock_rows=False,
    leases=False,
    hints=True,
    greatest="MAX",
    classify=_sqlite_fault,
)

POSTGRESQL: Final = Dialect(
    name="postgresql",
    now_epoch="extract(epoch FROM clock_timestamp())::double precision",
    lock_rows=True,
    leases=True,
    hints=False,
    greatest="GREATEST",
    classify=_pg_fault,
)
#: PostgreSQL in a read-only transaction: the same SQL, no row locks.
POSTGRESQL_READ: Final = replace(POSTGRESQL, lock_rows=False)
