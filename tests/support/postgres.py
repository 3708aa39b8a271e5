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
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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
