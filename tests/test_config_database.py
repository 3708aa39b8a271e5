"""``server.database`` names an SQLite file or a PostgreSQL database; the password of the
latter comes from ``server.database_password_file`` (or libpq's own means), never the URI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_config import TOKENS, base, errors_of, put, write

from masd.config import format_summary, parse_config
from masd.config.model import PostgresDatabase, sqlite_path
from masd.config.server import read_password
from masd.core.errors import MasdError

URI = "postgresql://masd@db.internal/masd?sslmode=verify-full"


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    for name, token in TOKENS.items():
        write(tmp_path / name, token + "\n")
    return tmp_path


def with_database(value: str, password_file: str | None = None) -> dict[str, object]:
    data = put(base(), ("server", "database"), value)
    if password_file is not None:
        put(data, ("server", "database_password_file"), password_file)
    return data


def test_a_path_is_an_sqlite_file_and_the_claim_timeout_defaults_to_30s(secrets_dir: Path) -> None:
    server = parse_config(with_database("state/masd.db"), base_dir=secrets_dir).server
    assert server.database == secrets_dir / "state/masd.db"
    assert sqlite_path(server.database, "x") == secrets_dir / "state/masd.db"
    assert server.claim_timeout == 30.0


def test_a_postgresql_uri_with_its_password_file(secrets_dir: Path) -> None:
    write(secrets_dir / "db.password", "pa ss:w@rd/%\n")  # one final newline, not the secret
    data = with_database(URI, "db.password")
    put(data, ("server", "claim_timeout"), "2m")
    config = parse_config(data, base_dir=secrets_dir)
    database = config.server.database
    assert database == PostgresDatabase(URI, "pa ss:w@rd/%")
    assert config.server.claim_timeout == 120.0
    assert "pa ss" not in repr(config.server)
    assert f"database  {URI}" in format_summary(config)
    with pytest.raises(
        MasdError, match=re.escape(f"masd serve needs an SQLite store; server.database is {URI}")
    ):
        sqlite_path(database, "masd serve")


def test_without_a_password_file_libpq_finds_the_password(secrets_dir: Path) -> None:
    for uri in (URI, "postgres://db.internal/masd", "postgresql:///masd?host=/run/postgresql"):
        database = parse_config(with_database(uri), base_dir=secrets_dir).server.database
        assert database == PostgresDatabase(uri, None)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        (
            "postgresql://masd:s3cret@db.internal/masd",
            "server.database: holds a password, which is refused in the URI",
        ),
        (
            "postgresql://masd@db.internal/masd?password=s3cret",
            "server.database: holds a password, which is refused in the URI",
        ),
        ("sqlite:///var/lib/masd/masd.db", 'server.database: "sqlite://..." is not a store'),
        ("https://db.internal/masd", 'server.database: "https://..." is not a store'),
    ],
)
def test_a_refused_uri_is_named_without_its_password(
    secrets_dir: Path, uri: str, message: str
) -> None:
    errors = errors_of(with_database(uri), secrets_dir)
    assert len(errors) == 1
    assert errors[0].startswith(message), errors
    assert "s3cret" not in errors[0]


def test_the_password_file_is_private_and_holds_one_password(secrets_dir: Path) -> None:
    write(secrets_dir / "open.password", "secret\n", mode=0o640)
    assert errors_of(with_database(URI, "open.password"), secrets_dir) == [
        f"server.database_password_file: {secrets_dir / 'open.password'} is readable by group "
        "or others (mode 0640); chmod 600 it"
    ]
    write(secrets_dir / "empty.password", "\n")
    assert errors_of(with_database(URI, "empty.password"), secrets_dir) == [
        "server.database_password_file: the password file is empty"
    ]
    assert errors_of(with_database(URI, "missing.password"), secrets_dir)[0].startswith(
        "server.database_password_file: cannot read"
    )
    write(secrets_dir / "db.password", "secret\n")
    assert errors_of(with_database("masd.db", "db.password"), secrets_dir) == [
        "server.database_password_file: only for a postgresql:// server.database "
        "(an SQLite file has no password)"
    ]


def test_only_one_final_newline_is_not_the_password() -> None:
    assert read_password(b"secret\n") == "secret"
    assert read_password(b"secret\r\n") == "secret"
    assert read_password(b"secret") == "secret"
    assert read_password(b" two words ") == " two words "
    for bad, why in ((b"a\nb\n", "more than one line"), (b"\n", "empty"), (b"\xff", "UTF-8")):
        with pytest.raises(ValueError, match=why):
            read_password(bad)


def test_commands_on_an_unreachable_postgresql_store_say_so(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from masd.cli import main
    from masd.testing.net import free_port

    store = f"postgresql://masd@127.0.0.1:{free_port()}/masd"
    uri = f"{store}?connect_timeout=2"
    config = tmp_path / "masd.toml"
    config.write_text(
        f'[server]\ndatabase = "{uri}"\nhttp = "127.0.0.1:0"\nlmtp = "unix:lmtp.sock"\n'
        'trusted_authserv_ids = ["mx.help.example"]\n\n'
        '[domains."help.example".types.ticket]\nrole = "master"\n'
    )
    runner = CliRunner()
    for argv in (["serve"], ["case", "list"]):
        done = runner.invoke(main, [*argv, "--config", str(config)])
        assert done.exit_code == 1, done.output
        # The store is named by its user, host, port and database, never its parameters.
        assert f"store-unavailable: cannot open store {store}:" in done.output, done.output
        assert "Connection refused" in done.output
