"""``masd db``: what the store commands do on either kind (an SQLite file, PostgreSQL).

``masd db migrate`` and ``masd db backup`` (in :mod:`masd.cli`) call :func:`migrate_database`
and :func:`backup_database`; ``masd db copy`` is :data:`db_copy`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NoReturn

import click

from masd.config.model import Database, PostgresDatabase
from masd.config.server import read_password, uri_problem
from masd.core.errors import MasdError

__all__ = ["backup_database", "db_copy", "migrate_database"]


def migrate_database(database: Database) -> list[str]:
    """Apply pending migrations to the store; the names applied."""
    if isinstance(database, PostgresDatabase):
        _need_psycopg()
        from masd.store.pg_admin import migrate as pg_migrate

        return pg_migrate(database.uri, database.password)
    from masd.store import migrate

    return migrate(database)


def backup_database(database: Database, dest: Path) -> None:
    """Back the SQLite store up to ``dest``; a PostgreSQL store is PostgreSQL's to back up."""
    if isinstance(database, PostgresDatabase):
        raise MasdError(
            f"masd db backup copies an SQLite file; back up the PostgreSQL store {database} "
            "with pg_dump (or the server's own backups)",
            code="not-sqlite",
        )
    from masd.store import backup

    backup(database, dest)


@click.command("copy")
@click.argument("source")
@click.argument("dest")
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The PostgreSQL password, on one line (mode 0600); else libpq's own means "
    "(.pgpass, PGPASSFILE, peer authentication).",
)
def db_copy(source: str, dest: str, password_file: Path | None) -> None:
    """Copy the whole store SOURCE into the empty store DEST, with masd stopped.

    Each is an SQLite file's path or a postgresql:// URI (libpq's form, without a
    password): SQLite into PostgreSQL, or back. DEST is created and migrated if need be
    and must be empty; SOURCE is only read. Prints the rows copied per table.
    """
    try:
        _need_psycopg()
    except MasdError as exc:
        _fail(exc.detail)
    from masd.store.copy import copy_store, is_uri

    for name, where in (("SOURCE", source), ("DEST", dest)):
        problem = uri_problem(where, hint="--password-file") if "://" in where else None
        if problem is not None:
            _fail(f"{name} {problem}")
    password = None if password_file is None else _password(password_file)
    if password is not None and not (is_uri(source) or is_uri(dest)):
        _fail("--password-file is for a postgresql:// SOURCE or DEST")
    try:
        copied = copy_store(source, dest, password=password)
    except MasdError as exc:
        _fail(exc.detail)
    width = max(len(c.table) for c in copied)
    for c in copied:
        click.echo(f"{c.table:<{width}}  {c.rows}")
    click.echo(f"copied {sum(c.rows for c in copied)} rows from {source} to {dest}")


def _need_psycopg() -> None:
    """PostgreSQL's client is an extra (``masd[postgresql]``): refused by name when missing."""
    if importlib.util.find_spec("psycopg") is None:
        raise MasdError(
            "PostgreSQL needs the psycopg package: pip install 'masd[postgresql]'",
            code="not-installed",
        )


def _password(path: Path) -> str:
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except OSError as exc:
        _fail(f"--password-file: cannot read {path}: {exc.strerror or exc}")
    if mode & 0o077:
        _fail(f"--password-file: {path} is readable by group or others (mode {mode:04o})")
    try:
        return read_password(data)
    except ValueError as exc:
        _fail(f"--password-file: {path} {exc}")


def _fail(text: str) -> NoReturn:
    click.echo(f"masd: {text}", err=True)
    raise SystemExit(1)
