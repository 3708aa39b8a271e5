"""How a PostgreSQL store's URI is shown in errors and log lines: where it is, never a password."""

from __future__ import annotations

import pytest

from masd.store import StoreError
from masd.store.pg_backend import PgStore
from masd.store.sql import value
from masd.store.uri import shown_uri
from masd.testing.net import free_port


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://masd@127.0.0.1:55432/masd", "postgresql://masd@127.0.0.1:55432/masd"),
        ("postgresql://masd@db.internal/masd", "postgresql://masd@db.internal/masd"),
        (
            "postgresql://masd@db.internal:6432/masd?sslmode=verify-full",
            "postgresql://masd@db.internal:6432/masd",
        ),
        ("postgresql://masd:s3cret@127.0.0.1:5433/masd", "postgresql://masd@127.0.0.1:5433/masd"),
        ("postgresql://masd@127.0.0.1/masd?password=s3cret", "postgresql://masd@127.0.0.1/masd"),
        ("postgresql://masd@[::1]:5433/masd", "postgresql://masd@[::1]:5433/masd"),
        ("postgresql://masd@a:5433,b:5434/masd", "postgresql://masd@a:5433,b:5434/masd"),
        (
            "postgresql://masd@/masd?host=/run/postgresql&port=5433",
            "postgresql://masd@/masd?host=/run/postgresql&port=5433",
        ),
        ("postgresql://db.internal/masd", "postgresql://db.internal/masd"),
        ("postgresql://masd@%zz/", "postgresql database"),
    ],
)
def test_a_uri_is_shown_with_its_host_and_port_and_without_a_password(uri: str, shown: str) -> None:
    assert shown_uri(uri) == shown
    assert "s3cret" not in shown_uri(uri)


def test_a_refused_connection_names_the_port_it_tried() -> None:
    port = free_port()
    uri = f"postgresql://masd:s3cret@127.0.0.1:{port}/masd?connect_timeout=2"
    with PgStore(uri, size=1) as store, pytest.raises(StoreError) as refused:
        store.write_sync(lambda tx: value(tx, "SELECT 1"))
    assert f"store postgresql://masd@127.0.0.1:{port}/masd: write failed" in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_a_refused_migration_names_the_port_and_never_the_password() -> None:
    from masd.store.pg_admin import connect

    port = free_port()
    with pytest.raises(StoreError) as refused:
        connect(f"postgresql://masd:s3cret@127.0.0.1:{port}/masd")
    assert f"cannot open store postgresql://masd@127.0.0.1:{port}/masd:" in str(refused.value)
    assert "s3cret" not in str(refused.value)
