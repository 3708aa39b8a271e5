"""Migration 7 on a real SQLite file: three tables kept in their primary key's B-tree.

A store made at version 6 with rows in ``deliveries``, ``statuses`` and ``idempotency``
is migrated: every row comes out the same, the tables have no ``rowid`` any more, their
indexes, their keys and the foreign key to ``handoffs`` hold.  (The purge, which now
finds old rows by key, is tests/test_purge.py's.)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from masd.store import MIGRATIONS, migrate

NOW = 1_790_000_000.0
CASE = "ticket=gs-1@help.example"
KEYED = {"deliveries": "dedupe", "statuses": "handoff_id, n", "idempotency": "peer, id"}


def _version_6_store(path: Path) -> None:
    migrate(path, migrations=MIGRATIONS[:6])
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO cases (key, address, domain, type, id, role, created_at) "
            "VALUES (?, ?, 'help.example', 'ticket', 'gs-1', 'master', ?)",
            (CASE, CASE, NOW),
        )
        conn.execute(
            "INSERT INTO handoffs (handoff_id, case_key, mode, peer, status, requested_at) "
            "VALUES ('h-1', ?, 'callback', 'mode:x', 'requested', ?)",
            (CASE, NOW),
        )
        for n in range(1, 4):
            conn.execute(
                "INSERT INTO statuses (handoff_id, n, seq, status, source, data, at) "
                "VALUES ('h-1', ?, ?, 'running', 'mode', '{\"detail\":\"é\"}', ?)",
                (n, n - 1, NOW + n),
            )
        for i in range(5):
            conn.execute(
                "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?, ?, ?)",
                (f"d-{4 - i}", f"msg-{i}", NOW + i),
            )
            conn.execute(
                "INSERT INTO idempotency (peer, id, status, body, at) VALUES (?, ?, 200, ?, ?)",
                (f"mode:{i % 2}", f"id-{i}", '{"ok":true}', NOW + i),
            )
    conn.close()


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(path)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY {key}").fetchall()
            for table, key in KEYED.items()
        }
    finally:
        conn.close()


def test_migration_7_keeps_every_row_and_drops_the_row_numbers(tmp_path: Path) -> None:
    path = tmp_path / "masd.db"
    _version_6_store(path)
    before = _rows(path)
    assert [m.name for m in MIGRATIONS[6:]] == migrate(path)
    assert _rows(path) == before
    conn = sqlite3.connect(path)
    try:
        for table in KEYED:
            with pytest.raises(sqlite3.OperationalError, match="rowid"):
                conn.execute(f"SELECT rowid FROM {table}")
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type='index'")}
        assert {"deliveries_at", "idempotency_at"} <= indexes
        left = conn.execute("SELECT name FROM sqlite_schema WHERE name LIKE '%_v7'").fetchall()
        assert left == []
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute(
                "INSERT INTO statuses (handoff_id, n, status, source, at) "
                "VALUES ('no-such-handoff', 1, 'running', 'mode', 0)"
            )
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute("INSERT INTO deliveries VALUES ('d-0', 'msg-x', 0)")
    finally:
        conn.close()
