"""Copying a whole store between kinds: ``masd db copy SOURCE DEST``, with masd stopped.

Either end is an SQLite file (a path) or a PostgreSQL database (a ``postgresql://`` URI).
The destination is created and migrated if need be, and must then be empty; the source must
be at the schema version this masd knows (both kinds number their migrations alike, so the
same version holds the same rows: :mod:`masd.store.pg_schema`).  Every table is copied in
one transaction of the destination (parents before children, so foreign keys hold as each
row arrives), from one snapshot of the source; a failure leaves the destination as it was.

Columns are copied by name: those both ends have.  The outbox's lease columns exist only on
PostgreSQL and are empty with masd stopped.  Row-id counters move with the rows: a new
outbox row, thread entry or send-log entry on the destination gets an id past every id the
source gave (on SQLite the outbox's ``AUTOINCREMENT`` counter; on PostgreSQL the identity
sequences), so an id kept in ``outbox_sent`` or named by a thread entry is never given again.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import psycopg
from psycopg import sql

from masd.store import files, pg_admin
from masd.store.files import StoreError
from masd.store.pg_schema import MIGRATIONS as PG_MIGRATIONS
from masd.store.schema import MIGRATIONS

__all__ = ["TABLES", "Copied", "copy_store", "is_uri"]

#: Every table of a store, parents before children.  ``masd_migrations`` is each end's own.
TABLES: Final = (
    "id_counters",
    "cases",
    "messages",
    "intakes",
    "deliveries",
    "handoffs",
    "statuses",
    "thread",
    "outbox",
    "outbox_sent",
    "idempotency",
    "send_log",
    "bounce_key",
    "bounces",
    "suppressions",
)
#: Each table whose ids a counter gives: its id column, and the tables holding its ids.
COUNTERS: Final = {
    "outbox": ("id", ("outbox", "outbox_sent")),
    "thread": ("pos", ("thread",)),
    "send_log": ("id", ("send_log",)),
}
BATCH: Final = 500
#: Fewer rows at a time where a row may be a whole mail (up to max_message_bytes).
BATCH_OF: Final = {"messages": 4}

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Copied:
    table: str
    rows: int


def is_uri(where: str) -> bool:
    """Whether ``where`` names a PostgreSQL database rather than an SQLite file."""
    return where.split("://", 1)[0].lower() in ("postgresql", "postgres") and "://" in where


class _End(Protocol):
    name: str

    def columns(self, table: str) -> list[str]: ...
    def count(self, table: str) -> int: ...
    def rows(self, table: str, columns: Sequence[str]) -> Iterator[list[Row]]: ...
    def high_water(self, table: str, column: str) -> int: ...
    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None: ...
    def move_counter(self, table: str, column: str, past: int) -> None: ...
    def commit(self) -> None: ...
    def close(self) -> None: ...


def copy_store(source: str, dest: str, *, password: str | None = None) -> list[Copied]:
    """Copy every table of ``source`` into ``dest``; the rows copied per table.

    ``password``: for whichever end is PostgreSQL (else libpq's own means)."""
    with contextlib.ExitStack() as stack:
        src = _open(source, password, create=False)
        stack.callback(src.close)
        dst = _open(dest, password, create=True)
        stack.callback(dst.close)
        _refuse_not_empty(dst)
        copied = [Copied(table, _copy_table(src, dst, table)) for table in TABLES]
        for table, (column, holding) in COUNTERS.items():
            past = max(src.high_water(held, column) for held in holding)
            dst.move_counter(table, column, past)
        dst.commit()
    return copied


def _open(where: str, password: str | None, *, create: bool) -> _End:
    return _Postgres(where, password, create=create) if is_uri(where) else _Sqlite(where, create)


def _refuse_not_empty(dst: _End) -> None:
    for table in TABLES:
        count = dst.count(table)
        if count:
            raise StoreError(
                f"destination {dst.name} is not empty: table {table} holds {count} row"
                f"{'s' if count != 1 else ''}; copy only into a new or empty store"
            )


def _copy_table(src: _End, dst: _End, table: str) -> int:
    theirs = set(src.columns(table))
    columns = [c for c in dst.columns(table) if c in theirs]
    total = 0
    for batch in src.rows(table, columns):
        dst.insert(table, columns, batch)
        total += len(batch)
    return total


def _latest(name: str, version: int, latest: int) -> None:
    if version != latest:
        raise StoreError(
            f"store {name} is at schema version {version}, this masd copies version {latest}: "
            "migrate it first (masd db migrate)"
        )


# -- SQLite ----------------------------------------------------------------------------------


def _ident(name: str) -> str:
    """A table or column name (from the constants above or the schema) as a quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


class _Sqlite:
    def __init__(self, where: str, create: bool) -> None:
        path = Path(where)
        self.name = str(path)
        if not create and not path.is_file():
            raise StoreError(f"cannot copy store {path}: no such file")
        self.conn = files.connect(path, query_only=not create)
        try:
            if create:
                files.apply_pending(path, self.conn, MIGRATIONS)
            _latest(self.name, files.check_version(path, self.conn, MIGRATIONS), len(MIGRATIONS))
            self.conn.execute("BEGIN IMMEDIATE" if create else "BEGIN")
        except BaseException:
            self.conn.close()
            raise

    def columns(self, table: str) -> list[str]:
        return [str(r[1]) for r in self.conn.execute(f"PRAGMA table_info({_ident(table)})")]

    def count(self, table: str) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {_ident(table)}").fetchone()[0])  # noqa: S608

    def rows(self, table: str, columns: Sequence[str]) -> Iterator[list[Row]]:
        listed = ", ".join(map(_ident, columns))
        cursor = self.conn.execute(
            f"SELECT {listed} FROM {_ident(table)} ORDER BY {self._order(table)}"  # noqa: S608
        )
        while batch := cursor.fetchmany(BATCH_OF.get(table, BATCH)):
            yield [tuple(r) for r in batch]

    def _order(self, table: str) -> str:
        """The order rows were inserted in: the ``rowid``, or for a table kept in its
        primary key's B-tree (``WITHOUT ROWID``) that key's columns."""
        found = self.conn.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (table,))
        if not found.fetchone()[0]:
            return "rowid"
        info = self.conn.execute(f"PRAGMA table_info({_ident(table)})").fetchall()
        return ", ".join(_ident(str(r[1])) for r in sorted(info, key=lambda r: r[5]) if r[5])

    def high_water(self, table: str, column: str) -> int:
        top = self.conn.execute(f"SELECT max({_ident(column)}) FROM {_ident(table)}").fetchone()[0]  # noqa: S608
        seq = self.conn.execute(
            "SELECT max(seq) FROM sqlite_sequence WHERE name = ?", (table,)
        ).fetchone()
        return max(int(top or 0), int(seq[0] or 0) if seq else 0)

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        listed = ", ".join(map(_ident, columns))
        marks = ", ".join("?" for _ in columns)
        try:
            self.conn.executemany(
                f"INSERT INTO {_ident(table)} ({listed}) VALUES ({marks})",  # noqa: S608
                rows,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot copy into {self.name}: {table}: {exc}") from exc

    def move_counter(self, table: str, column: str, past: int) -> None:
        """On an ``AUTOINCREMENT`` table, its counter past ``past`` (others use max + 1)."""
        declared = self.conn.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        if past < 1 or declared is None or "AUTOINCREMENT" not in str(declared[0]).upper():
            return
        done = self.conn.execute(
            "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (past, table)
        )
        if done.rowcount == 0:
            self.conn.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, past)
            )

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def close(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self.conn.close()


# -- PostgreSQL ------------------------------------------------------------------------------


class _Postgres:
    def __init__(self, uri: str, password: str | None, *, create: bool) -> None:
        self.name = uri
        if create:
            pg_admin.migrate(uri, password)
        self.conn = pg_admin.connect(uri, password)
        try:
            self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            _latest(uri, pg_admin.version(uri, self.conn), len(PG_MIGRATIONS))
        except BaseException:
            self.conn.close()
            raise

    def _run(self, query: sql.SQL | sql.Composed, params: Sequence[Any] = ()) -> list[Row]:
        try:
            return self.conn.execute(query, params).fetchall()
        except psycopg.Error as exc:
            raise StoreError(f"cannot copy {self.name}: {exc}") from exc

    def columns(self, table: str) -> list[str]:
        found = self._run(
            sql.SQL(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = %s ORDER BY ordinal_position"
            ),
            (table,),
        )
        return [str(r[0]) for r in found]

    def count(self, table: str) -> int:
        return int(
            self._run(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))[0][0]
        )

    def rows(self, table: str, columns: Sequence[str]) -> Iterator[list[Row]]:
        # Case numbers come from a sequence per type: id_counters as they have moved them.
        source = "case_counters" if table == "id_counters" else table
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(source)
        )
        with self.conn.cursor(name=f"masd_copy_{table}") as cursor:
            cursor.execute(query)
            while batch := cursor.fetchmany(BATCH_OF.get(table, BATCH)):
                yield batch

    def high_water(self, table: str, column: str) -> int:
        top = self._run(
            sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(column), sql.Identifier(table))
        )[0][0]
        sequence = self._run(sql.SQL("SELECT pg_get_serial_sequence(%s, %s)"), (table, column))[0][
            0
        ]
        last = 0
        if sequence is not None:
            value, called = self._run(
                sql.SQL("SELECT last_value, is_called FROM {}").format(
                    sql.Identifier(*str(sequence).split(".", 1))
                )
            )[0]
            last = int(value) if called else 0
        return max(int(top or 0), last)

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns))
        )
        try:
            with self.conn.cursor() as cursor, cursor.copy(statement) as copying:
                for row in rows:
                    copying.write_row(row)
        except psycopg.Error as exc:
            raise StoreError(f"cannot copy into {self.name}: {table}: {exc}") from exc

    def move_counter(self, table: str, column: str, past: int) -> None:
        if past >= 1:
            self._run(
                sql.SQL("SELECT setval(pg_get_serial_sequence(%s, %s), %s)"), (table, column, past)
            )

    def commit(self) -> None:
        try:
            self.conn.commit()
        except psycopg.Error as exc:
            raise StoreError(f"cannot copy into {self.name}: {exc}") from exc

    def close(self) -> None:
        self.conn.close()
