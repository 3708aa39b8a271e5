"""Housekeeping keeps what the rules need and forgets the rest (docs/protocol.md §3, §9)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from masd.app import App
from masd.clock import TestClock
from masd.config import load_config
from masd.service import DEDUPE_WINDOW, IDEMPOTENCY_WINDOW, PURGE_BATCH, purge
from masd.store import Store

DAY = 86400.0


def test_purge_forgets_only_expired_rows(tmp_path: Path) -> None:
    now = 100 * DAY
    with Store.open(tmp_path / "masd.db") as store:

        def fill(db):  # type: ignore[no-untyped-def]
            for age, name in ((DEDUPE_WINDOW + 1, "old"), (DEDUPE_WINDOW - 60, "young")):
                db.execute(
                    "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?, ?, ?)",
                    (name, name, now - age),
                )
            for age, name in ((IDEMPOTENCY_WINDOW + 1, "old"), (60, "young")):
                db.execute(
                    "INSERT INTO idempotency (peer, id, status, body, at) "
                    "VALUES ('p', ?, 200, '{}', ?)",
                    (name, now - age),
                )
            for state in ("done", "failed", "pending"):
                db.execute(
                    "INSERT INTO outbox (kind, queue, payload, created_at, next_attempt_at, "
                    "deliver_until, state) VALUES ('mail', 'q', '{}', ?, ?, ?, ?)",
                    (now - 30 * DAY, now, now, state),
                )

        store.write_sync(fill)
        removed = store.write_sync(lambda db: purge(db, now))
        assert removed == {"deliveries": 1, "idempotency": 1, "outbox": 1, "send_log": 0}
        left = store.read_sync(
            lambda db: (
                db.execute("SELECT dedupe FROM deliveries").fetchall(),
                db.execute("SELECT id FROM idempotency").fetchall(),
                sorted(r[0] for r in db.execute("SELECT state FROM outbox").fetchall()),
            )
        )
        assert left == ([("young",)], [("young",)], ["failed", "pending"])


def test_a_large_backlog_goes_in_bounded_jobs(tmp_path: Path) -> None:
    """Each job removes at most PURGE_BATCH rows per table (it holds the writer,
    and its statement journal stays small); the app's purge runs jobs until done."""
    now = 100 * DAY
    old = PURGE_BATCH * 2 + 7

    async def main() -> None:
        config = tmp_path / "masd.toml"
        config.write_text(
            f'[server]\nlmtp = "unix:{tmp_path / "lmtp.sock"}"\nhttp = "127.0.0.1:0"\n'
            f'database = "{tmp_path / "masd.db"}"\n'
            '[domains."help.example".types.ticket]\nrole = "master"\n'
        )
        app = App(load_config(config), clock=TestClock(now))
        await app.start()
        try:
            assert app.store is not None

            def fill(db):  # type: ignore[no-untyped-def]
                db.conn.executemany(
                    "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?, ?, ?)",
                    [(f"d{i}", f"m{i}", now - DEDUPE_WINDOW - 1 - i) for i in range(old)]
                    + [("young", "young", now - 60)],
                )

            await app.store.write(fill)
            first = await app.store.write(lambda db: purge(db, now))
            assert first["deliveries"] == PURGE_BATCH
            assert await app.purge() == {
                "deliveries": old - PURGE_BATCH,
                "idempotency": 0,
                "outbox": 0,
                "send_log": 0,
            }
            left = await app.store.read(
                lambda db: db.execute("SELECT dedupe FROM deliveries").fetchall()
            )
            assert left == [("young",)]
        finally:
            await app.stop()

    asyncio.run(main())
