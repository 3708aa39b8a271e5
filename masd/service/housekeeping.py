"""Forgetting what no rule needs any more (docs/protocol.md §3, §9)."""

from __future__ import annotations

from masd.service.intake import DEDUPE_WINDOW
from masd.service.runtime import Runtime
from masd.store import Tx, retention
from masd.store import purge as rows

#: docs/protocol.md §9: "ids are kept at least 7 days".
IDEMPOTENCY_WINDOW = 7 * 24 * 3600
#: Delivered outbox rows are kept this long (for the read side and debugging).
DONE_OUTBOX_KEPT = 7 * 24 * 3600
#: Rows purged per table in one store job: a job holds the writer, so a large
#: backlog (a store that was offline for days) goes in many short jobs, each
#: with a small statement journal, with deliveries in between.
PURGE_BATCH = 1000
#: The per-recipient send cap counts the sends of the last 24 hours; older ones go.
SEND_LOG_KEPT = 24 * 3600
#: Cases removed in one store job (each with all its rows).
RETIRE_BATCH = 50


def purge(tx: Tx, now: float, limit: int = PURGE_BATCH) -> dict[str, int]:
    """Forget what no rule needs any more, at most ``limit`` rows per table;
    returns the rows removed per table (``limit`` for one: call again).

    docs/protocol.md §3 keeps delivery dedupe 7 days and docs/protocol.md §9 keeps idempotency
    ids "at least 7 days"; delivered outbox rows go after 7 days, the send log
    after 24 hours.  Cases (with their messages, threads and failed outbox
    rows) go by their type's ``retain`` (:func:`expired`, :func:`retire`).
    """
    removed = rows.purge(
        tx,
        deliveries_before=now - DEDUPE_WINDOW,
        idempotency_before=now - IDEMPOTENCY_WINDOW,
        done_outbox_before=now - DONE_OUTBOX_KEPT,
        limit=limit,
    )
    removed["send_log"] = retention.purge_send_log(tx, now - SEND_LOG_KEPT, limit)
    return removed


def expired(rt: Runtime, tx: Tx, now: float, limit: int = RETIRE_BATCH) -> list[tuple[str, float]]:
    """Up to ``limit`` cases past their type's ``retain`` (a read): each key, and the
    time its latest entry must be older than.  Cases of a type no longer configured
    are kept."""
    found: list[tuple[str, float]] = []
    for domain_name, domain in rt.config.domains.items():
        for type_name, typ in domain.types.items():
            if len(found) >= limit:
                return found
            before = now - typ.retain
            keys = retention.expired_cases(tx, domain_name, type_name, before, limit - len(found))
            found += [(key, before) for key in keys]
    return found


def retire(tx: Tx, found: list[tuple[str, float]]) -> dict[str, int]:
    """Remove the cases :func:`expired` found that are still expired now (a write):
    each with its messages, thread, handoffs, statuses and outbox rows.  The rows
    removed per table."""
    total = dict.fromkeys(retention.TABLES, 0)
    for key, before in found:
        if retention.still_expired(tx, key, before):
            for table, n in retention.remove_case(tx, key).items():
                total[table] += n
    return total
