"""Delivery state on the read side: from the outbox row, after housekeeping, and after migration.

Real store files, written by the real service (or, for a store from before
migration 2, by the SQL that version ran).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
from pathlib import Path
from typing import Any

from support.http import deliver, write_config

from masd.config import load_config
from masd.core.times import rfc3339
from masd.read.case_views import thread_json
from masd.service import (
    DONE_OUTBOX_KEPT,
    Runtime,
    outbox_after,
    outbox_done,
    outbox_failed,
    outbox_retry,
    purge,
)
from masd.store import MIGRATIONS, Store, migrate

NOW = 1_790_000_000.0


def _due(tx: Any) -> list[Any]:
    """Every row due at NOW (the sender's first look)."""
    return outbox_after(tx, 0, NOW, 100)[0]


def _sends(doc: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The delivery of each send of a thread, by kind (one of each here)."""
    assert doc is not None
    return {e["kind"]: e["delivery"] for e in doc["entries"] if "delivery" in e}


def test_each_send_reads_its_row_through_retry_sent_and_failed(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    rt = Runtime(config, new_id=lambda: secrets.token_hex(16))

    async def main() -> None:
        with Store.open(config.server.database) as store:
            got = await deliver(store, rt, "ticket!callback@help.example", NOW)
            key = got.case_key
            read = lambda: store.read(lambda db: thread_json(db, key))  # noqa: E731
            queued = _sends(await read())
            assert set(queued) == {"contract.out", "mail.out"}
            for d in queued.values():
                assert d == {
                    "state": "queued",
                    "attempts": 0,
                    "last_error": None,
                    "next_attempt_at": rfc3339(NOW),
                    "done_at": None,
                }
            doc = await read()
            assert doc is not None
            ids = {e["kind"]: e["outbox_id"] for e in doc["entries"] if "outbox_id" in e}
            items = {i.id: i for i in await store.read(lambda db: _due(db))}
            assert set(items) == set(ids.values())
            request, ack = items[ids["contract.out"]], items[ids["mail.out"]]

            await store.write(lambda db: outbox_retry(rt, db, ack, "451 4.3.0 try later", NOW))
            await store.write(lambda db: outbox_done(db, request.id, NOW + 1))
            later = _sends(await read())
            assert later["contract.out"] == {
                "state": "sent",
                "attempts": 1,
                "last_error": None,
                "next_attempt_at": None,
                "done_at": rfc3339(NOW + 1),
            }
            retrying = later["mail.out"]
            assert retrying["state"] == "retrying"
            assert (retrying["attempts"], retrying["last_error"]) == (1, "451 4.3.0 try later")
            assert rfc3339(NOW) <= retrying["next_attempt_at"] <= rfc3339(NOW + 1)
            assert retrying["done_at"] is None

            await store.write(lambda db: outbox_failed(rt, db, ack, "550 5.1.1 no such user", NOW))
            failed = _sends(await read())["mail.out"]
            assert failed["state"] == "failed"
            assert failed["last_error"] == "550 5.1.1 no such user"
            assert failed["done_at"] == rfc3339(NOW)

    asyncio.run(main())


def test_a_sent_row_still_reads_sent_after_housekeeping_deleted_it(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    rt = Runtime(config, new_id=lambda: secrets.token_hex(16))

    async def main() -> None:
        with Store.open(config.server.database) as store:
            got = await deliver(store, rt, "ticket!callback@help.example", NOW)
            for item in await store.read(_due):
                await store.write(lambda db, i=item.id: outbox_done(db, i, NOW + 2))
            before = _sends(await store.read(lambda db: thread_json(db, got.case_key)))
            later = NOW + DONE_OUTBOX_KEPT + 60
            removed = await store.write(lambda db: purge(db, later))
            assert removed["outbox"] == 2
            left = await store.read(lambda db: db.execute("SELECT count(*) FROM outbox").fetchone())
            assert left == (0,)
            after = _sends(await store.read(lambda db: thread_json(db, got.case_key)))
            assert after == before
            assert after["mail.out"]["state"] == "sent"
            assert after["mail.out"]["attempts"] == 1
            assert after["mail.out"]["done_at"] == rfc3339(NOW + 2)

    asyncio.run(main())


def _version_1_store(path: Path) -> None:
    """A store at migration 1 with one case: its entries as that version wrote them."""
    migrate(path, migrations=MIGRATIONS[:1])
    mail = "From: ticket=gs-1@help.example\r\nMessage-ID: <m1@help.example>\r\n\r\nHi\r\n"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at) "
            "VALUES ('ticket=gs-1@help.example', 'ticket=gs-1@help.example', 'help.example', "
            "'ticket', 'gs-1', 'master', 'alice@example.com', ?)",
            (NOW,),
        )
        entries = [
            ("mail.in", {"from": "alice@example.com"}),
            ("contract.out", {"type": "handoff.request", "id": "req-1", "peer": "mode:x"}),
            ("mail.out", {"to": "alice@example.com", "message_id": "<m1@help.example>"}),
            ("contract.out", {"type": "handoff.cancel", "id": "cancel-1", "peer": "mode:x"}),
        ]
        for seq, (kind, data) in enumerate(entries, 1):
            conn.execute(
                "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, ?, ?, ?)",
                ("ticket=gs-1@help.example", seq, kind, NOW + seq, json.dumps(data)),
            )
        rows = [
            ("contract", {"type": "handoff.request", "id": "req-1"}, "done", 1),
            ("mail", {"rcpt_to": "alice@example.com", "message": mail}, "pending", 2),
        ]
        for kind, payload, state, attempts in rows:
            conn.execute(
                "INSERT INTO outbox (kind, queue, peer, case_key, payload, created_at, "
                "next_attempt_at, deliver_until, state, attempts) "
                "VALUES (?, 'q', 'p', 'ticket=gs-1@help.example', ?, ?, ?, ?, ?, ?)",
                (kind, json.dumps(payload), NOW, NOW + 60, NOW + 3600, state, attempts),
            )
    conn.close()


def test_migration_2_keeps_the_order_and_links_old_entries_to_their_rows(tmp_path: Path) -> None:
    path = tmp_path / "masd.db"
    _version_1_store(path)
    assert migrate(path) == [m.name for m in MIGRATIONS[1:]]
    with Store.open(path, migrate=False) as store:
        pos = store.read_sync(
            lambda db: db.execute("SELECT pos, seq FROM thread ORDER BY pos").fetchall()
        )
        # Each entry keeps the place its rowid had: commit order.
        assert [tuple(r) for r in pos] == [(1, 1), (2, 2), (3, 3), (4, 4)]
        doc = store.read_sync(lambda db: thread_json(db, "ticket=gs-1@help.example"))
    assert doc is not None
    by_seq = {e["seq"]: e for e in doc["entries"]}
    assert by_seq[2]["outbox_id"] == 1
    assert by_seq[2]["delivery"]["state"] == "sent"
    assert by_seq[3]["outbox_id"] == 2
    assert by_seq[3]["delivery"]["state"] == "retrying"
    assert by_seq[3]["delivery"]["attempts"] == 2
    # No row left for it: only a delivered row is ever deleted.
    assert "outbox_id" not in by_seq[4]
    assert by_seq[4]["delivery"] == {
        "state": "sent",
        "attempts": None,
        "last_error": None,
        "next_attempt_at": None,
        "done_at": None,
    }
    assert "delivery" not in by_seq[1]
