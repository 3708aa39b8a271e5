"""The private PostgreSQL server the PostgreSQL store's tests run on (support/postgres.py)."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import psycopg
import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401
from support.system import REQUIRE_VARIABLE, missing

from masd.store import StoreError
from masd.store.pg_admin import connect
from masd.testing.net import listening
from masd.testing.postgres import PostgresServer, find_bindir


def test_a_fresh_database_takes_the_password_on_tcp_and_none_on_the_socket(
    postgres: Database,  # noqa: F811
) -> None:
    with connect(postgres.uri, postgres.password) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (postgres.name,)
        assert conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone() == (0,)
        conn.execute("CREATE TABLE left_here (x INTEGER)")
        conn.commit()
    with connect(postgres.socket_uri) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (postgres.name,)
    with pytest.raises(StoreError, match="password") as refused:
        connect(postgres.uri, "not-the-password")
    assert postgres.password not in str(refused.value)


def test_each_test_gets_its_own_empty_database(postgres: Database) -> None:  # noqa: F811
    with connect(postgres.uri, postgres.password) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchall() == []  # the table the test above left is not here


def test_the_server_runs_as_a_user_initdb_accepts(postgres_server: PostgresServer) -> None:  # noqa: F811
    with connect(postgres_server.socket_uri()) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    assert row is not None
    data = Path(row[0])
    assert data.parent == postgres_server.root
    owner = pwd.getpwuid(data.stat().st_uid).pw_name
    assert owner == ("postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name)
    assert os.stat(data).st_uid != 0


def test_a_stopped_server_leaves_nothing_behind(postgres_server: PostgresServer) -> None:  # noqa: F811
    server = PostgresServer(postgres_server.bindir).start()
    root, port = server.root, server.port
    assert root is not None
    assert root.is_dir()
    assert asyncio.run(listening(port))
    assert port != postgres_server.port
    server.stop()
    assert not root.exists()
    assert not asyncio.run(listening(port))
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(
            postgres_server.uri().replace(str(postgres_server.port), str(port)),
            password=server.password,
            connect_timeout=2,
        )
    server.stop()  # twice is harmless


def test_the_binaries_are_found_under_the_newest_major(tmp_path: Path) -> None:
    assert find_bindir(tmp_path) is None
    for major in ("13", "15", "9.6"):
        bindir = tmp_path / major / "bin"
        bindir.mkdir(parents=True)
        for program in ("initdb", "pg_ctl"):
            (bindir / program).touch()
    (tmp_path / "16" / "bin").mkdir(parents=True)  # no programs: not a candidate
    assert find_bindir(tmp_path) == tmp_path / "15" / "bin"


def test_without_postgresql_the_skip_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception) as caught:
        missing("PostgreSQL", "postgresql")
    assert caught.value.msg == "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        missing("PostgreSQL", "postgresql")
    assert failed.value.msg.endswith(f"and {REQUIRE_VARIABLE} is set")
