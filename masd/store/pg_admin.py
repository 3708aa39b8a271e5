"""A PostgreSQL store's database: connecting, migrating, creating and dropping databases.

What :mod:`masd.store.files` is to an SQLite file, this module is to a PostgreSQL database
named by a libpq URI (``postgresql://user@host/dbname?sslmode=...``).  A password is never
part of the URI: it is passed apart (``server.database_password_file``, ``--password-file``)
or left to libpq's own means (``.pgpass``, ``PGPASSFILE``, peer authentication).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from masd.store.files import StoreError
from masd.store.pg_schema import MIGRATIONS
from masd.store.schema import Migration
from masd.store.uri import shown_uri

__all__ = ["connect", "create_database", "drop_database", "migrate", "recorded", "version"]

CONNECT_TIMEOUT_SECONDS: Final = 10
#: The advisory lock a migration holds (transaction-scoped): hosts starting together
#: migrate one at a time, and each looks again at what is recorded once it holds it.
MIGRATION_LOCK: Final = 0x6D617364  # "masd"


def connect(
    uri: str, password: str | None = None, *, autocommit: bool = False
) -> psycopg.Connection[tuple[Any, ...]]:
    """One connection to the database ``uri`` names; any failure is a :class:`StoreError`."""
    extra: dict[str, Any] = {} if password is None else {"password": password}
    try:
        return psycopg.connect(
            uri, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_SECONDS, **extra
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot open store {shown_uri(uri)}: {_reason(exc)}") from exc


def create_database(uri: str, name: str, password: str | None = None) -> None:
    """Create the empty database ``name`` on the server of ``uri`` (a maintenance database)."""
    _admin(uri, password, sql.SQL("CREATE DATABASE {} ENCODING 'UTF8' TEMPLATE template0"), name)


def drop_database(uri: str, name: str, password: str | None = None) -> None:
    """Drop the database ``name``, ending any session still on it."""
    _admin(uri, password, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)"), name)


def _admin(uri: str, password: str | None, statement: sql.SQL, name: str) -> None:
    with connect(uri, password, autocommit=True) as conn:
        try:
            conn.execute(statement.format(sql.Identifier(name)))
        except psycopg.Error as exc:
            raise StoreError(f"{shown_uri(uri)}: database {name!r}: {_reason(exc)}") from exc


def _reason(exc: psycopg.Error) -> str:
    """An error as messages show it: the server's first line and its SQLSTATE."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} ({exc.sqlstate})" if exc.sqlstate else text


# -- migrations ---------------------------------------------------------------------------

Conn = psycopg.Connection[tuple[Any, ...]]


def recorded(conn: Conn) -> dict[int, str]:
    """The migrations recorded in the database: version -> name (none on a new database)."""
    found = conn.execute("SELECT to_regclass('masd_migrations') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return {}
    rows = conn.execute("SELECT version, name FROM masd_migrations").fetchall()
    return {int(v): str(n) for v, n in rows}


def version(uri: str, conn: Conn, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """The database's schema version; refused when this masd does not know it."""
    done = recorded(conn)
    known = migrations[-1].version if migrations else 0
    current = max(done, default=0)
    if current > known:
        raise StoreError(
            f"store {uri} has schema version {current} ({done[current]!r}), "
            f"newer than version {known} this masd knows; upgrade masd"
        )
    for m in migrations:
        if m.version in done and done[m.version] != m.name:
            raise StoreError(
                f"store {uri} records migration {m.version} as {done[m.version]!r}, "
                f"this masd knows it as {m.name!r}"
            )
    return current


def migrate(
    uri: str, password: str | None = None, *, migrations: Sequence[Migration] = MIGRATIONS
) -> list[str]:
    """Apply the pending migrations to the database ``uri``, each in its own transaction."""
    applied: list[str] = []
    with connect(uri, password) as conn:
        for m in migrations:
            if _apply(uri, conn, m, migrations):
                applied.append(m.name)
    return applied


def _apply(uri: str, conn: Conn, m: Migration, migrations: Sequence[Migration]) -> bool:
    if not isinstance(m.apply, str):
        raise StoreError(f"migration {m.version} ({m.name}) is not SQL text")
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if m.version <= version(uri, conn, migrations):
                return False
            conn.execute(
                "CREATE TABLE IF NOT EXISTS masd_migrations (version BIGINT PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
            conn.execute(m.apply.encode())
            conn.execute(
                "INSERT INTO masd_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                (m.version, m.name, time.time()),
            )
    except psycopg.Error as exc:
        raise StoreError(
            f"migration {m.version} ({m.name}) failed on store {uri}: {_reason(exc)}"
        ) from exc
    return True
