"""The PostgreSQL schema (masd/store/pg_schema.py) has one source per fact, as SQLite's does.

- Released migrations are frozen: each text is pinned by its SHA-256, and the schema they
  build together on a real server is ``tests/expected_schema_pg.sql`` (read back from
  PostgreSQL's catalog: columns, constraints, indexes, triggers and functions, by name).
- Every enumeration it checks holds exactly the names the SQLite schema's test ties to the
  code (``conformance/transitions.json``, :mod:`masd.core.kinds`).
- Each SQLite table and column has its PostgreSQL twin, so a store copies between kinds.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401
from test_schema import ENUMERATIONS

from masd.store import MIGRATIONS as SQLITE_MIGRATIONS
from masd.store import StoreError, migrate
from masd.store.pg_admin import connect, recorded
from masd.store.pg_admin import migrate as pg_migrate
from masd.store.pg_schema import MIGRATIONS
from masd.store.schema import (
    ERASABLE_VERSION,
    HOSTS_ADD_UP_VERSION,
    KEYED_TABLES_VERSION,
    THREAD_SEQ_VERSION,
    Migration,
)

EXPECTED = Path(__file__).parent / "expected_schema_pg.sql"

#: SHA-256 of each released PostgreSQL migration's text, by version.  Never change an entry.
RELEASED = {
    1: "dac5aee0baa42a61cdf59a1ded73cf9d3ebc678e153abfe5787e15020299b029",
    2: "a020d00e9910ac9fdfb94ead34fc511c964941fb1fda0cc6f6e2ac2350ef8707",
    3: "e004ebd5b5532a4b85984a62f8ad48a81aa3460c1ca07701f386135d72cdecf5",
    4: "368c0c7ac1306875b5acaefe618d3274e98b58e53daca8b5578b04e077e70665",
    ERASABLE_VERSION: "b4486267e2fce49513235fbb8a14d5843c4ee80a2389b9ccf273bce20d52a51f",
    HOSTS_ADD_UP_VERSION: "42a82076515191e478a4165c6b3bf422f65cd3aa84bad776688595cd64cd11e2",
    KEYED_TABLES_VERSION: "e004ebd5b5532a4b85984a62f8ad48a81aa3460c1ca07701f386135d72cdecf5",
    THREAD_SEQ_VERSION: "e004ebd5b5532a4b85984a62f8ad48a81aa3460c1ca07701f386135d72cdecf5",
}

_ANY = re.compile(r"CHECK \(\((\w+) = ANY \(ARRAY\[([^\]]*)\]\)\)\)")

_CATALOG = {
    "columns": (
        "SELECT table_name, column_name, data_type, is_nullable, column_default, "
        "is_identity, identity_generation FROM information_schema.columns "
        "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
    ),
    "constraints": (
        "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) "
        "FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
        "WHERE n.nspname = 'public' ORDER BY 1, 2"
    ),
    "indexes": (
        "SELECT tablename, indexname, indexdef FROM pg_indexes "
        "WHERE schemaname = 'public' ORDER BY 1, 2"
    ),
    "triggers": (
        "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger "
        "WHERE NOT tgisinternal ORDER BY 1, 2"
    ),
    "functions": (
        "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' ORDER BY 1"
    ),
}


def pg_schema_of(uri: str, password: str) -> str:
    """The public schema of the database ``uri``, as PostgreSQL's catalog describes it."""
    out: list[str] = []
    with connect(uri, password) as conn:
        for kind, query in _CATALOG.items():
            out.append(f"-- {kind}\n")
            for row in conn.execute(query).fetchall():
                out.append(" | ".join("NULL" if v is None else str(v) for v in row) + "\n")
            out.append("\n")
    return "".join(out)


def checked_enumerations(schema: str) -> Iterator[tuple[tuple[str, str], frozenset[str]]]:
    """((table, column), names) for each ``CHECK ((column = ANY (ARRAY['a'::text, ...])))``."""
    constraints = schema.split("-- constraints\n", 1)[1].split("\n\n", 1)[0]
    for line in constraints.splitlines():
        table = line.split(" | ", 1)[0]
        for column, listed in _ANY.findall(line):
            values = re.findall(r"'([^']*)'::text", listed)
            if values:  # forwarded IN (0, 1) is a flag, not an enumeration
                yield (table, column), frozenset(values)


@pytest.fixture
def built(postgres: Database) -> str:  # noqa: F811
    assert pg_migrate(postgres.uri, postgres.password) == [m.name for m in MIGRATIONS]
    return pg_schema_of(postgres.uri, postgres.password)


def test_released_migrations_are_unchanged() -> None:
    texts = {m.version: m.apply for m in MIGRATIONS}
    assert set(texts) == set(RELEASED), "a released migration is unpinned or missing"
    for version, text in texts.items():
        assert isinstance(text, str)
        digest = hashlib.sha256(text.encode()).hexdigest()
        assert digest == RELEASED[version], f"migration {version} was edited; append one instead"


def test_versions_match_sqlites() -> None:
    assert [(m.version, m.name) for m in MIGRATIONS] == [
        (m.version, m.name) for m in SQLITE_MIGRATIONS
    ]


def test_the_migrations_build_the_expected_schema(built: str) -> None:
    assert built == EXPECTED.read_text()


def test_each_checked_enumeration_holds_the_names_the_code_uses(built: str) -> None:
    found = dict(checked_enumerations(built))
    assert set(found) == set(ENUMERATIONS)
    for where, names in ENUMERATIONS.items():
        assert found[where] == names, where


def test_a_name_missing_on_one_side_is_found(built: str) -> None:
    found = dict(checked_enumerations(built.replace("'mail.out'::text, ", "", 1)))
    assert found[("thread", "kind")] != ENUMERATIONS[("thread", "kind")]


def test_every_sqlite_column_has_its_twin(built: str, tmp_path: Path) -> None:
    migrate(tmp_path / "masd.db")
    conn = sqlite3.connect(tmp_path / "masd.db")
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        sqlite_columns = {
            (t, row[1]) for t in tables for row in conn.execute(f"PRAGMA table_info({t})")
        }
    finally:
        conn.close()
    columns = built.split("-- columns\n", 1)[1].split("\n\n", 1)[0].splitlines()
    pg_columns = {tuple(line.split(" | ")[:2]) for line in columns}
    # masd_migrations is the recorder's own; PostgreSQL adds the outbox's leases, the
    # writers' transaction ids and the view of the case numbers' sequences.
    assert pg_columns - sqlite_columns == {
        ("outbox", "claimed_by"),
        ("outbox", "claimed_until"),
        ("thread", "xid"),
        ("cases", "thread_xid"),
        ("case_counters", "domain"),
        ("case_counters", "type"),
        ("case_counters", "next_n"),
    }
    assert sqlite_columns - pg_columns == set()


def test_migrating_again_applies_nothing_and_a_newer_store_is_refused(
    postgres: Database,  # noqa: F811
) -> None:
    names = [m.name for m in MIGRATIONS]
    assert names[-1] == "thread-seq"
    assert pg_migrate(postgres.uri, postgres.password) == names
    assert pg_migrate(postgres.uri, postgres.password) == []
    with connect(postgres.uri, postgres.password) as conn:
        assert recorded(conn) == {m.version: m.name for m in MIGRATIONS}
    last = MIGRATIONS[-1].version
    newer = (*MIGRATIONS, Migration(last + 1, "later", "SELECT 1"))
    assert pg_migrate(postgres.uri, postgres.password, migrations=newer) == ["later"]
    with pytest.raises(StoreError, match=f"newer than version {last} this masd knows"):
        pg_migrate(postgres.uri, postgres.password)


def test_a_failing_migration_leaves_nothing_of_itself(postgres: Database) -> None:  # noqa: F811
    broken = (Migration(1, "initial", "CREATE TABLE half (x BIGINT); SELECT nonsense"),)
    with pytest.raises(StoreError, match=r"migration 1 \(initial\) failed"):
        pg_migrate(postgres.uri, postgres.password, migrations=broken)
    with connect(postgres.uri, postgres.password) as conn:
        assert recorded(conn) == {}
        assert conn.execute("SELECT to_regclass('half')").fetchone() == (None,)


def test_the_checks_refuse_what_sqlites_refuse(built: str, postgres: Database) -> None:  # noqa: F811
    bad = [
        "INSERT INTO cases (key, address, domain, type, id, role, created_at) "
        "VALUES ('k', 'a', 'd', 't', '1', 'owner', 0)",
        "INSERT INTO cases (key, address, domain, type, id, role, created_at, policy) "
        "VALUES ('k', 'a', 'd', 't', '1', 'master', 0, 'not json')",
        "INSERT INTO outbox (kind, queue, payload, created_at, next_attempt_at, deliver_until, "
        "claimed_by) VALUES ('mail', 'q', '{}', 0, 0, 0, 'host-a')",
    ]
    with connect(postgres.uri, postgres.password, autocommit=True) as conn:
        for statement in bad:
            with pytest.raises((psycopg.errors.DataError, psycopg.errors.IntegrityError)):
                conn.execute(statement.encode())
        assert conn.execute("SELECT count(*) FROM cases").fetchone() == (0,)


#: masd.store.cases.next_number's statement, in PostgreSQL's placeholders.
NEXT_NUMBER = "SELECT masd_case_number(%s, %s)"


def test_two_hosts_taking_case_numbers_at_once_never_collide_nor_wait(
    postgres: Database,  # noqa: F811
) -> None:
    pg_migrate(postgres.uri, postgres.password)
    with (
        connect(postgres.uri, postgres.password) as first,
        connect(postgres.uri, postgres.password) as second,
    ):
        # The type's sequence is made by its first case, starting where id_counters stood.
        first.execute("INSERT INTO id_counters VALUES ('help.example', 'ticket', 5)")
        first.commit()
        assert first.execute(NEXT_NUMBER, ("help.example", "ticket")).fetchone() == (5,)
        first.commit()
        assert first.execute(NEXT_NUMBER, ("help.example", "ticket")).fetchone() == (6,)
        # The first host's transaction is still open: the second takes a number at once.
        assert second.execute(NEXT_NUMBER, ("help.example", "ticket")).fetchone() == (7,)
        second.rollback()  # a case rolled back leaves its number unused
        first.commit()
        assert first.execute(NEXT_NUMBER, ("help.example", "ticket")).fetchone() == (8,)
        assert first.execute(NEXT_NUMBER, ("help.example", "chat")).fetchone() == (1,)
        first.commit()
        counters = first.execute("SELECT * FROM case_counters ORDER BY type").fetchall()
        assert counters == [("help.example", "chat", 2), ("help.example", "ticket", 9)]
