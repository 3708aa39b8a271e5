"""A PostgreSQL store's database: connecting to it, creating and dropping databases.

What :mod:`masd.store.files` is to an SQLite file, this module is to a PostgreSQL database
named by a libpq URI (``postgresql://user@host/dbname?sslmode=...``).  A password is never
part of the URI: it is passed apart (``server.database_password_file``, ``--password-file``)
or left to libpq's own means (``.pgpass``, ``PGPASSFILE``, peer authentication).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg import sql

from masd.store.files import StoreError

__all__ = ["connect", "create_database", "drop_database"]

CONNECT_TIMEOUT_SECONDS: Final = 10


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
        raise StoreError(f"cannot open store {uri}: {_reason(exc)}") from exc


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
            raise StoreError(f"{uri}: database {name!r}: {_reason(exc)}") from exc


def _reason(exc: psycopg.Error) -> str:
    """An error as messages show it: the server's first line and its SQLSTATE."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} ({exc.sqlstate})" if exc.sqlstate else text
