"""The outbox: contract messages and mails waiting to go out, one queue per case and peer.

Rows are written by the job that caused them and delivered by
:mod:`masd.edges.outbox`; PROFILE §7: "Messages about one case to one peer
are delivered in order", so only the head (lowest id) of a queue is due.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from masd.store.sql import Tx, dumps, run, tuples


@dataclass(frozen=True)
class OutboxItem:
    id: int
    kind: str
    queue: str
    peer: str | None
    case_key: str | None
    url: str | None
    payload: str
    attempts: int
    deliver_until: float


@dataclass(frozen=True)
class NewRow:
    """A row to queue: rows of one ``queue`` are delivered in order."""

    kind: str
    queue: str
    peer: str
    case_key: str | None
    url: str | None
    payload: Mapping[str, Any]


def queue(tx: Tx, row: NewRow, now: float, deliver_until: float) -> int:
    """Queue ``row``; its outbox id (a thread entry names its row by it)."""
    found = tuples(
        tx,
        "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
        "next_attempt_at, deliver_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            row.kind,
            row.queue,
            row.peer,
            row.case_key,
            row.url,
            dumps(dict(row.payload)),
            now,
            now,
            deliver_until,
        ),
    )
    return int(found[0][0])


def abandon_requests(
    tx: Tx, case_key: str, handoff_id: str, at: float | None = None
) -> list[tuple[int, str]]:
    """Withdraw the pending handoff.request of ``handoff_id``: (outbox id, message id) each."""
    found = tuples(
        tx,
        "UPDATE outbox SET state = 'abandoned', done_at = ? WHERE state = 'pending' "
        "AND kind = 'contract' AND case_key = ? "
        "AND json_extract(payload, '$.type') = 'handoff.request' "
        "AND json_extract(payload, '$.handoff_id') = ? RETURNING id, json_extract(payload, '$.id')",
        (at, case_key, handoff_id),
    )
    return [(int(oid), str(mid)) for oid, mid in found]


def due_outbox(
    tx: Tx, now: float, limit: int = 64, exclude: Iterable[str] = ()
) -> list[OutboxItem]:
    """The head of each queue whose time has come (PROFILE §7: in order per case and peer)."""
    busy = list(exclude)
    found = tuples(
        tx,
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until FROM outbox o WHERE o.state = 'pending' AND o.next_attempt_at <= ? "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at, o.id LIMIT ?",
        (now, limit + len(busy)),
    )
    items = [OutboxItem(*r) for r in found if r[2] not in busy]
    return items[:limit]


def next_outbox_at(tx: Tx, busy: Iterable[str] = ()) -> float | None:
    """When the next queue head not in ``busy`` falls due.

    Not the earliest pending row: a row behind a head in backoff is not due.
    """
    skip = set(busy)
    found = tuples(
        tx,
        "SELECT o.queue, o.next_attempt_at FROM outbox o WHERE o.state = 'pending' "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at LIMIT ?",
        (len(skip) + 1,),
    )
    times = [float(at) for queue, at in found if queue not in skip]
    return times[0] if times else None


def done(tx: Tx, item_id: int, at: float | None = None) -> None:
    """Delivered (``at``: when, the read side's ``done_at``)."""
    run(
        tx,
        "UPDATE outbox SET state = 'done', attempts = attempts + 1, last_error = NULL, "
        "done_at = ? WHERE id = ?",
        (at, item_id),
    )


def retry_at(tx: Tx, item_id: int, error: str, next_at: float) -> None:
    run(
        tx,
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? "
        "WHERE id = ?",
        (error, next_at, item_id),
    )


def failed(tx: Tx, item_id: int, detail: str, at: float | None = None) -> None:
    """Given up (``at``: when, the read side's ``done_at``)."""
    run(
        tx,
        "UPDATE outbox SET state = 'failed', attempts = attempts + 1, last_error = ?, "
        "done_at = ? WHERE id = ?",
        (detail, at, item_id),
    )
