"""Forgetting rows no rule needs any more, in bounded batches."""

from __future__ import annotations

from masd.store.sql import Tx, run


def purge(
    tx: Tx,
    *,
    deliveries_before: float,
    idempotency_before: float,
    done_outbox_before: float,
    limit: int,
) -> dict[str, int]:
    """Delete at most ``limit`` rows per table older than its bound; the rows
    removed per table.  Cases, messages, threads and failed outbox rows are kept."""
    # Both tables are found by their keys (SQLite keeps them without row numbers).
    return {
        "deliveries": run(
            tx,
            "DELETE FROM deliveries WHERE dedupe IN "
            "(SELECT dedupe FROM deliveries WHERE at < ? LIMIT ?)",
            (deliveries_before, limit),
        ),
        "idempotency": run(
            tx,
            "DELETE FROM idempotency WHERE (peer, id) IN "
            "(SELECT peer, id FROM idempotency WHERE at < ? LIMIT ?)",
            (idempotency_before, limit),
        ),
        "outbox": run(
            tx,
            "DELETE FROM outbox WHERE id IN "
            "(SELECT id FROM outbox WHERE state = 'done' AND created_at < ? LIMIT ?)",
            (done_outbox_before, limit),
        ),
    }
