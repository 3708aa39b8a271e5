"""Counts for ``GET /metrics``, read in one snapshot (:mod:`masd.metrics`)."""

from __future__ import annotations

from masd.store.sql import Tx, dialect, tuples


def outbox_depth(tx: Tx) -> list[tuple[str, str, int, int]]:
    """(kind, state, rows, attempts) of the pending and failed outbox rows."""
    found = tuples(
        tx,
        "SELECT kind, state, COUNT(*), COALESCE(SUM(attempts), 0) FROM outbox "
        "WHERE state IN ('pending', 'failed') GROUP BY kind, state",
    )
    return [(str(k), str(s), int(n), int(a)) for k, s, n, a in found]


def handoffs_by_status(tx: Tx) -> list[tuple[str, int]]:
    """(status, handoffs) by current status."""
    found = tuples(tx, "SELECT status, COUNT(*) FROM handoffs GROUP BY status")
    return [(str(s), int(n)) for s, n in found]


def statuses_by_status(tx: Tx) -> list[tuple[str, int]]:
    """(status, times recorded) over every handoff's history."""
    found = tuples(tx, "SELECT status, COUNT(*) FROM statuses GROUP BY status")
    return [(str(s), int(n)) for s, n in found]


def refusals_by_reason(tx: Tx) -> list[tuple[str, int]]:
    """(reason, ``mail.refused`` entries) over every thread."""
    found = tuples(
        tx,
        f"SELECT COALESCE({dialect(tx).json_get('data', 'reason')}, 'none'), "  # noqa: S608
        "COUNT(*) FROM thread "
        "WHERE kind = 'mail.refused' GROUP BY 1",
    )
    return [(str(r), int(n)) for r, n in found]
