"""A private PostgreSQL server for the tests that need one (:mod:`masd.testing.postgres`).

``postgres_server`` (session-scoped) starts one server for the whole run and stops it at the
end, leaving nothing behind; ``postgres`` (per test) is a fresh, empty database on it, dropped
after the test.  Where PostgreSQL is not installed the test is skipped, naming the Debian
package, or fails when ``MASD_REQUIRE_SYSTEM_TESTS`` is set (:mod:`support.system`).

Tests use them by importing both names: ``from support.postgres import postgres,
postgres_server  # noqa: F401``.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from masd.testing.config import MasterSetup, write_master_config
from masd.testing.net import free_ports
from masd.testing.postgres import PostgresServer, find_bindir
from support.system import missing

_names = itertools.count(1)


@dataclass(frozen=True)
class Database:
    """One empty database of the private server: its URI (TCP) and the password it needs."""

    name: str
    uri: str
    password: str
    socket_uri: str  # the same database over the unix socket: no password


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    if bindir is None:
        missing("PostgreSQL", "postgresql")
    with PostgresServer(bindir) as server:
        yield server


@pytest.fixture
def postgres(postgres_server: PostgresServer) -> Iterator[Database]:
    name = f"masd_test_{next(_names)}"
    uri = postgres_server.create_database(name)
    try:
        yield Database(name, uri, postgres_server.password, postgres_server.socket_uri(name))
    finally:
        postgres_server.drop_database(name)


def two_hosts(
    directory: Path,
    db: Database,
    *,
    endpoint_url: str,
    smtp_port: int,
    deadline: str = "1h",
    server_lines: str = "",
) -> tuple[MasterSetup, MasterSetup]:
    """Two hosts' configurations on ``db`` (``directory/a`` and ``directory/b``) that differ in
    their listeners only; ``server_lines`` go into ``[server]`` after the store's."""
    first = write_master_config(
        directory / "a", endpoint_url=endpoint_url, smtp_port=smtp_port, deadline=deadline
    )
    password = directory / "a" / "secrets" / "db.password"
    password.write_text(db.password + "\n")
    password.chmod(0o600)
    text = first.config.read_text().replace(
        'database = "masd.db"\n',
        f'database = "{db.uri}"\ndatabase_password_file = "secrets/db.password"\n{server_lines}',
    )
    first.config.write_text(text)
    shutil.copytree(directory / "a", directory / "b")
    lmtp, http = free_ports(2)
    second = directory / "b" / "masd.toml"
    second.write_text(
        text.replace(f"127.0.0.1:{first.lmtp_port}", f"127.0.0.1:{lmtp}").replace(
            f"127.0.0.1:{first.http_port}", f"127.0.0.1:{http}"
        )
    )
    return first, MasterSetup(second, lmtp, http, first.admin_token, first.endpoint_token)
