"""The schema has one source per fact.

- Released migrations are frozen: each one's text is pinned by its SHA-256,
  and the schema the migrations build together is ``tests/expected_schema.sql``
  (an entry per table and index, as SQLite keeps it).  A schema change is a
  new migration, a new pin and a new expected schema, side by side in review.
- Every enumeration the schema checks (``CHECK (col IN (...))``) holds exactly
  the names the code builds its values from: handoff statuses from
  ``conformance/transitions.json``, the rest from :mod:`masd.core.kinds`.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from masd._resources import conformance_file
from masd.core import kinds
from masd.core.engine import Status, Thread
from masd.core.status import MACHINE
from masd.store import MIGRATIONS, migrate
from masd.store.schema import (
    ERASABLE_VERSION,
    HOSTS_ADD_UP_VERSION,
    KEYED_TABLES_VERSION,
    THREAD_SEQ_VERSION,
)

EXPECTED = Path(__file__).parent / "expected_schema.sql"

#: SHA-256 of each released migration's SQL text, by version.  Never change
#: an entry: a released migration is never edited (see masd.store.schema).
RELEASED = {
    1: "7cb04cc0e7703da54367b2833a8002870b94b341be123a119e9b8f63193467a1",
    2: "876c6b05b66740f097896d66e20d05da3c59ec1209bbc84c020e35b3da987b31",
    3: "1bcedcdf8b0b19a6a9ff731c45a15cb4a54d10433423e0c2f82e6e2cb06efc49",
    4: "f3bcdc266d3a32aaedf0d6e382e47ce10e5b19bacb927a883fbb43390fe8c79d",
    ERASABLE_VERSION: "2c9e91c474044cdb61d3108ee3eb8f4872b140624ae972669aff14776bef3302",
    HOSTS_ADD_UP_VERSION: "e004ebd5b5532a4b85984a62f8ad48a81aa3460c1ca07701f386135d72cdecf5",
    KEYED_TABLES_VERSION: "7865e1f6fd6b0207b7812d1db8b493a564c7cb5b249e42d61d44b64684353aa2",
    THREAD_SEQ_VERSION: "c728f9fcee7198b8b11245fdb10c6318fa7ce79f23a3fb1d45cb9f11e3a06c1d",
}

_CHECK_IN = re.compile(r"CHECK \((\w+) IN \(([^)]*)\)\)")


def _statuses_in_the_table() -> frozenset[str]:
    with conformance_file("transitions.json").open("rb") as fh:
        return frozenset(json.load(fh)["statuses"])


#: (table, column) -> the names its CHECK must hold.
ENUMERATIONS = {
    ("cases", "role"): kinds.ROLES,
    ("handoffs", "status"): _statuses_in_the_table(),
    ("statuses", "status"): _statuses_in_the_table(),
    ("statuses", "source"): kinds.STATUS_SOURCES,
    ("thread", "kind"): kinds.THREAD_KINDS,
    ("outbox", "kind"): kinds.OUTBOX_KINDS,
    ("outbox", "state"): kinds.OUTBOX_STATES,
}


def schema_of(path: Path) -> str:
    """Every table and index of the database at ``path``, as SQLite keeps it, by name."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_schema "
            "WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return "".join(f"-- {kind} {name}\n{sql};\n\n" for kind, name, sql in rows)


def checked_enumerations(schema: str) -> Iterator[tuple[tuple[str, str], frozenset[str]]]:
    """((table, column), names) for each ``CHECK (column IN ('a', 'b'))`` of ``schema``."""
    for block in schema.split("-- table ")[1:]:
        table = block.split("\n", 1)[0]
        for column, listed in _CHECK_IN.findall(block):
            values = re.findall(r"'([^']*)'", listed)
            if values:  # IN (0, 1) is a flag, not an enumeration
                yield (table, column), frozenset(values)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("schema") / "masd.db"
    migrate(path)
    return schema_of(path)


def test_released_migrations_are_unchanged() -> None:
    texts = {m.version: m.apply for m in MIGRATIONS if m.version in RELEASED}
    assert set(texts) == set(RELEASED), "a released migration is missing"
    for version, text in texts.items():
        assert isinstance(text, str)
        digest = hashlib.sha256(text.encode()).hexdigest()
        assert digest == RELEASED[version], f"migration {version} was edited; append one instead"


def test_every_migration_is_pinned_once_released() -> None:
    # A new migration is released with its pin; an unpinned one would be free to change.
    assert [m.version for m in MIGRATIONS] == sorted(RELEASED)


def test_the_migrations_build_the_expected_schema(built: str) -> None:
    assert built == EXPECTED.read_text()


def test_each_checked_enumeration_holds_the_names_the_code_uses(built: str) -> None:
    found = dict(checked_enumerations(built))
    # Every enumeration of the schema is tied to its source, and every source is checked.
    assert set(found) == set(ENUMERATIONS)
    for where, names in ENUMERATIONS.items():
        assert found[where] == names, where


def test_the_status_table_and_the_code_agree() -> None:
    assert _statuses_in_the_table() == MACHINE.statuses
    # What the engine's effects may carry is what the schema accepts.
    assert frozenset(get_args(get_type_hints(Thread)["kind"])) == kinds.THREAD_KINDS
    assert frozenset(get_args(get_type_hints(Status)["source"])) <= kinds.STATUS_SOURCES


def test_a_name_added_on_one_side_only_is_found() -> None:
    schema = EXPECTED.read_text().replace("'mail.out', ", "", 1)
    found = dict(checked_enumerations(schema))
    assert found[("thread", "kind")] == kinds.THREAD_KINDS - {"mail.out"}
    assert found[("thread", "kind")] != ENUMERATIONS[("thread", "kind")]
