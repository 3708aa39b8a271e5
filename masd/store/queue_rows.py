"""The outbox as an operator sees and steers it (``masd queue``).

Rows waiting (``pending``) and given up (``failed``) are listed; a retry
makes a row due now (a failed one pending again), a drop withdraws it
(``abandoned``, the state of a row withdrawn before it went out).  The
sender (:mod:`masd.edges.outbox`) finds a retried row by its
``next_attempt_at`` once it is woken.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from masd.store.backend import Dialect
from masd.store.outbox import OutboxItem
from masd.store.sql import Tx, dialect, run, tuples

#: A mail's first 4096 characters are read, to find its Message-ID and Subject.


@dataclass(frozen=True)
class QueueRow:
    """An outbox row as ``masd queue`` lists it."""

    id: int
    kind: str
    queue: str
    case_key: str | None
    peer: str | None
    state: str
    attempts: int
    last_error: str | None
    created_at: float
    next_attempt_at: float
    done_at: float | None
    #: a contract message's type and id
    type: str | None
    message_id: str | None
    #: a mail's recipient and the start of its text (headers)
    rcpt_to: str | None
    head: str | None


@cache
def _columns(d: Dialect) -> str:
    return (
        "SELECT id, kind, queue, case_key, peer, state, attempts, last_error, created_at, "  # noqa: S608 - dialect words only
        "next_attempt_at, done_at, "
        f"CASE kind WHEN 'contract' THEN {d.json_get('payload', 'type')} END, "
        f"CASE kind WHEN 'contract' THEN {d.json_get('payload', 'id')} END, "
        f"CASE kind WHEN 'mail' THEN {d.json_get('payload', 'rcpt_to')} END, "
        f"CASE kind WHEN 'mail' THEN substr({d.json_get('payload', 'message')}, 1, 4096) END "
        "FROM outbox "
    )


def _row(r: tuple[Any, ...]) -> QueueRow:
    return QueueRow(*r)


def listed(tx: Tx, limit: int) -> list[QueueRow]:
    """Rows waiting, then rows given up, each oldest first, at most ``limit``."""
    found = tuples(
        tx,
        _columns(dialect(tx))
        + "WHERE state IN ('pending', 'failed') ORDER BY state = 'failed', id LIMIT ?",
        (limit,),
    )
    return [_row(r) for r in found]


def row(tx: Tx, item_id: int) -> QueueRow | None:
    found = tuples(tx, _columns(dialect(tx)) + "WHERE id = ?", (item_id,))
    return _row(found[0]) if found else None


def item(tx: Tx, item_id: int) -> OutboxItem | None:
    """The row as the sender's outcome functions take it."""
    found = tuples(
        tx,
        "SELECT id, kind, queue, peer, case_key, url, payload, attempts, deliver_until "
        "FROM outbox WHERE id = ?",
        (item_id,),
    )
    if not found:
        return None
    i, kind, queue, peer, case_key, url, payload, attempts, until = found[0]
    return OutboxItem(
        id=i,
        kind=kind,
        queue=queue,
        peer=peer,
        case_key=case_key,
        url=url,
        payload=payload,
        attempts=attempts,
        deliver_until=until,
    )


def retry_now(tx: Tx, item_id: int, now: float, deliver_until: float) -> bool:
    """Make a pending or failed row due at ``now``; a failed one is pending again
    and may be retried until at least ``deliver_until``.  False if it is neither."""
    return (
        run(
            tx,
            "UPDATE outbox SET state = 'pending', next_attempt_at = ?, "  # noqa: S608
            f"deliver_until = CASE state WHEN 'failed' THEN {dialect(tx).greatest} "
            "(deliver_until, ?) ELSE deliver_until END, done_at = NULL "
            "WHERE id = ? AND state IN ('pending', 'failed')",
            (now, deliver_until, item_id),
        )
        == 1
    )


def retry_all(tx: Tx, now: float) -> list[tuple[int, str]]:
    """Make every pending row due at ``now``; (id, queue) of those that were waiting longer."""
    found = tuples(
        tx,
        "UPDATE outbox SET next_attempt_at = ? WHERE state = 'pending' AND next_attempt_at > ? "
        "RETURNING id, queue",
        (now, now),
    )
    return sorted((int(i), str(q)) for i, q in found)


def withdraw(tx: Tx, item_id: int, reason: str, at: float, *, attempts: int | None = None) -> bool:
    """A pending or failed row will not be sent: ``abandoned``, with ``reason``
    (and ``attempts`` as given: a withdrawal is not an attempt)."""
    return (
        run(
            tx,
            "UPDATE outbox SET state = 'abandoned', last_error = ?, done_at = ?, "
            "attempts = COALESCE(?, attempts) WHERE id = ? AND state IN ('pending', 'failed')",
            (reason, at, attempts, item_id),
        )
        == 1
    )
