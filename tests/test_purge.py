"""Housekeeping keeps what the rules need and forgets the rest (PROFILE §2, §6)."""

from __future__ import annotations

from pathlib import Path

from masd.service import DEDUPE_WINDOW, IDEMPOTENCY_WINDOW, purge
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
        assert removed == {"deliveries": 1, "idempotency": 1, "outbox": 1}
        left = store.read_sync(
            lambda db: (
                db.execute("SELECT dedupe FROM deliveries").fetchall(),
                db.execute("SELECT id FROM idempotency").fetchall(),
                sorted(r[0] for r in db.execute("SELECT state FROM outbox").fetchall()),
            )
        )
        assert left == ([("young",)], [("young",)], ["failed", "pending"])
