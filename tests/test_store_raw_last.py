"""Migration 3 on a real SQLite file: ``messages.raw`` moves to the row's end.

A store made at version 2, with mails in it (small and large, on a case and
on an intake, with the optional columns empty), is migrated; every row comes
out the same, byte for byte, with the rowid it had, the indexes are back, the
foreign key to ``cases`` still holds, and a mail recorded afterwards (through
blob I/O, as a large one is) reads back whole.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from masd.core.event import build_event
from masd.core.trust import TrustSettings
from masd.store import MIGRATIONS, Store, messages, migrate

NOW = 1_790_000_000.0
CASE = "ticket=gs-1@help.example"
COLUMNS_V2 = (
    "message_ref, case_key, intake_ref, rcpt_to, mail_from, message_id, from_address, "
    "sha256, size, raw, event, received_at"
)


def _rows(path: Path) -> list[dict[str, Any]]:
    """Every messages row by column name, with its rowid, in rowid order."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        found = conn.execute("SELECT rowid AS rid, * FROM messages ORDER BY rowid").fetchall()
        return [dict(r) for r in found]
    finally:
        conn.close()


def _version_2_store(path: Path) -> None:
    """A store at migration 2 with four mails, inserted with rowids out of key order."""
    migrate(path, migrations=MIGRATIONS[:2])
    big = random.Random(3).randbytes(3 << 20)
    mails = [
        # rowid, ref, case, intake, message_id, from_address, raw
        (7, "m-b", CASE, None, "<b@example.org>", "pat@example.org", b"Hi\r\n"),
        (2, "m-a", CASE, None, None, None, big),
        (9, "m-c", None, "in-1", "<c@example.org>", "sam@example.org", b"\x00\xff\r\n.\r\n"),
        (4, "m-d", None, None, None, None, b""),
    ]
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO cases (key, address, domain, type, id, role, created_at) "
            "VALUES (?, ?, 'help.example', 'ticket', 'gs-1', 'master', ?)",
            (CASE, CASE, NOW),
        )
        for rowid, ref, case, intake, mid, sender, raw in mails:
            conn.execute(
                f"INSERT INTO messages (rowid, {COLUMNS_V2}) "
                "VALUES (?, ?, ?, ?, 'ticket@help.example', 'pat@example.org', "
                "?, ?, ?, ?, ?, ?, ?)",
                (
                    rowid,
                    ref,
                    case,
                    intake,
                    mid,
                    sender,
                    hashlib.sha256(raw).hexdigest(),
                    len(raw),
                    raw,
                    json.dumps({"message_ref": ref, "subject": "é ✓"}),
                    NOW + rowid / 3,
                ),
            )
    conn.close()


def test_migration_3_keeps_every_mail_byte_for_byte_and_puts_raw_last(tmp_path: Path) -> None:
    path = tmp_path / "masd.db"
    _version_2_store(path)
    before = _rows(path)
    assert [m.name for m in MIGRATIONS[2:]] == migrate(path)
    after = _rows(path)
    assert after == before
    assert [r["rid"] for r in after] == [2, 4, 7, 9]
    assert len(after[0]["raw"]) == 3 << 20
    conn = sqlite3.connect(path)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(messages)")]
        assert columns[-1] == "raw"
        assert sorted(columns) == sorted(c.strip() for c in COLUMNS_V2.split(","))
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(messages)")}
        assert {"messages_case", "messages_intake"} <= indexes
        assert (
            conn.execute("SELECT name FROM sqlite_schema WHERE name LIKE '%_v3'").fetchall() == []
        )
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute(
                f"INSERT INTO messages ({COLUMNS_V2}) "
                "VALUES ('m-x', 'no-such-case', NULL, 'r', 'f', NULL, NULL, 's', 0, x'', '{}', 0)"
            )
    finally:
        conn.close()


@pytest.mark.parametrize("size", [100, messages.BLOB_IO_BYTES + 17])
def test_a_mail_recorded_after_migration_3_reads_back_whole(tmp_path: Path, size: int) -> None:
    """Both ways a mail is written (a bound value; a zeroblob filled by blob I/O)."""
    path = tmp_path / "masd.db"
    _version_2_store(path)
    raw = b"Subject: late\r\n\r\n" + random.Random(size).randbytes(size)
    ev = build_event(
        raw,
        mail_from="pat@example.org",
        rcpt_to="ticket@help.example",
        received_at="2026-09-21T10:00:00Z",
        message_ref="m-late",
        trust=TrustSettings.of([]),
    ).event
    sha = hashlib.sha256(raw).hexdigest()
    with Store.open(path) as store:
        store.write_sync(
            lambda tx: messages.record(tx, ev, raw, sha, NOW, dedupe="d-late", case_key=CASE)
        )
        assert store.read_sync(lambda tx: messages.raw(tx, "m-late")) == raw
        assert store.read_sync(lambda tx: messages.raw(tx, "m-a")) == _rows(path)[0]["raw"]
    (late,) = (r for r in _rows(path) if r["message_ref"] == "m-late")
    assert (late["size"], late["sha256"], late["case_key"]) == (len(raw), sha, CASE)
    assert json.loads(late["event"])["message_ref"] == "m-late"
