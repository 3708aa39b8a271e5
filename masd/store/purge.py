"""Forgetting rows no rule needs any more, in bounded batches."""

from __future__ import annotations

from masd.store.sql import Tx, dialect, run


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
    d = dialect(tx)
    deliveries, answers = d.row_order("dedupe"), d.row_order("(peer, id)")
    return {
        "deliveries": run(
            tx,
            f"DELETE FROM deliveries WHERE {deliveries} IN "  # noqa: S608 - dialect words only
            f"(SELECT {deliveries.strip('()')} FROM deliveries WHERE at < ? LIMIT ?)",
            (deliveries_before, limit),
        ),
        "idempotency": run(
            tx,
            f"DELETE FROM idempotency WHERE {answers} IN "  # noqa: S608 - dialect words only
            f"(SELECT {answers.strip('()')} FROM idempotency WHERE at < ? LIMIT ?)",
            (idempotency_before, limit),
        ),
        "outbox": run(
            tx,
            "DELETE FROM outbox WHERE id IN "
            "(SELECT id FROM outbox WHERE state = 'done' AND created_at < ? LIMIT ?)",
            (done_outbox_before, limit),
        ),
    }
