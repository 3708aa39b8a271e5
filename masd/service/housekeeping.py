"""Forgetting what no rule needs any more (docs/protocol.md §3, §9)."""

from __future__ import annotations

from masd.service.intake import DEDUPE_WINDOW
from masd.store import Tx
from masd.store import purge as rows

#: docs/protocol.md §9: "ids are kept at least 7 days".
IDEMPOTENCY_WINDOW = 7 * 24 * 3600
#: Delivered outbox rows are kept this long (for the read side and debugging).
DONE_OUTBOX_KEPT = 7 * 24 * 3600
#: Rows purged per table in one store job: a job holds the writer, so a large
#: backlog (a store that was offline for days) goes in many short jobs, each
#: with a small statement journal, with deliveries in between.
PURGE_BATCH = 1000


def purge(tx: Tx, now: float, limit: int = PURGE_BATCH) -> dict[str, int]:
    """Forget what no rule needs any more, at most ``limit`` rows per table;
    returns the rows removed per table (``limit`` for one: call again).

    docs/protocol.md §3 keeps delivery dedupe 7 days and docs/protocol.md §9 keeps idempotency
    ids "at least 7 days"; delivered outbox rows go after 7 days.  Cases,
    messages, threads and failed outbox rows are kept.
    """
    return rows.purge(
        tx,
        deliveries_before=now - DEDUPE_WINDOW,
        idempotency_before=now - IDEMPOTENCY_WINDOW,
        done_outbox_before=now - DONE_OUTBOX_KEPT,
        limit=limit,
    )
