"""The outbound queue as an operator steers it (``masd queue``, docs/protocol.md §16.7).

In the spirit of ``postsuper``: retry an item now, or drop it.  What waits
and what failed is listed by the read side (:mod:`masd.read.queue_items`).

- **retry** makes a waiting item due now; a failed one waits again, with a
  fresh ``server.retry_for``.  A failed ``handoff.request`` is not retried:
  its failure already failed the handoff and resumed the case by email.
- **drop** withdraws an item (outbox state ``abandoned``).  The case's
  thread records a ``delivery.failed`` entry whose detail is
  :data:`DROPPED`; a waiting item is given up the way a refusal gives it up
  (a dropped ``handoff.request`` fails its handoff and resumes by email).

Each of :func:`retry`, :func:`retry_waiting` and :func:`drop` is one store
write job.  Inside masd they run behind the admin API
(``POST /mas/v0.1/admin/outbox/...``), which wakes the outbox once the job
has committed; the ``masd queue`` command calls that API and, when no masd
answers, runs the same job on the store itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from masd.core.errors import MasdError
from masd.core.times import rfc3339
from masd.service import NO_WAKES, Runtime, Wakes, outbox_failed
from masd.store import Tx, append_thread
from masd.store import queue_rows as rows
from masd.store.queue_rows import QueueRow

#: The detail of a dropped item, in its ``delivery.failed`` entry and as its last error.
DROPPED: Final = "dropped by the operator"


def wake_queues(*queues: str) -> Wakes:
    """The outbox looks at these queues' heads again (their head is due now, or gone)."""
    return Wakes(outbox=True, queues=frozenset(queues))


class QueueError(MasdError):
    """An operator's request on the queue that cannot be done: ``code`` says why."""

    #: HTTP status by code.
    STATUS: Final = {"unknown-item": 404, "wrong-state": 409}

    @property
    def status(self) -> int:
        return self.STATUS[self.code]


@dataclass(frozen=True)
class Done:
    """What a retry or a drop did: the item's row afterwards, and what it woke.

    The read side shows the row (:func:`masd.read.queue_items.item_json`).
    """

    row: QueueRow
    wakes: Wakes


def _settled(r: QueueRow) -> QueueError:
    if r.state == "done":
        why = f"was sent at {rfc3339(r.done_at) or 'an unknown time'}"
    else:
        why = f"was withdrawn ({r.last_error or 'at its handoff deadline'})"
    return QueueError(f"item {r.id} {why}: nothing to do", code="wrong-state")


def _find(tx: Tx, item_id: int) -> QueueRow:
    found = rows.row(tx, item_id)
    if found is None:
        raise QueueError(f"no outbox item {item_id}", code="unknown-item")
    if found.state not in ("pending", "failed"):
        raise _settled(found)
    return found


def retry(rt: Runtime, tx: Tx, item_id: int, now: float) -> Done:
    """Item ``item_id`` is due now (a failed one waits again)."""
    r = _find(tx, item_id)
    if r.state == "failed" and r.kind == "contract" and r.type == "handoff.request":
        raise QueueError(
            f"item {item_id} is a handoff.request whose failure already failed its handoff "
            "and resumed the case by email; a new request takes a new !MODE mail",
            code="wrong-state",
        )
    rows.retry_now(tx, item_id, now, now + rt.config.server.retry_for)
    after = rows.row(tx, item_id)
    assert after is not None
    return Done(after, wake_queues(r.queue))


@dataclass(frozen=True)
class Retried:
    """What retrying every waiting item did: their ids, and what it woke."""

    ids: list[int]
    wakes: Wakes


def retry_waiting(tx: Tx, now: float) -> Retried:
    """Every waiting item is due now: those that were waiting for a later try."""
    found = rows.retry_all(tx, now)
    return Retried([i for i, _ in found], wake_queues(*(q for _, q in found)))


def drop(rt: Runtime, tx: Tx, item_id: int, now: float) -> Done:
    """Item ``item_id`` is withdrawn and the thread says it was dropped (see the module)."""
    r = _find(tx, item_id)
    wakes = NO_WAKES
    if r.state == "pending":
        item = rows.item(tx, item_id)
        assert item is not None
        # Given up as a refusal gives it up: the thread entry and what follows.
        wakes = outbox_failed(rt, tx, item, DROPPED, now)
    elif r.case_key is not None:
        append_thread(tx, r.case_key, "delivery.failed", _failed_entry(r), at=now)
    rows.withdraw(tx, item_id, DROPPED, now, attempts=r.attempts)
    after = rows.row(tx, item_id)
    assert after is not None
    return Done(after, wakes | wake_queues(r.queue))


def _failed_entry(r: QueueRow) -> dict[str, Any]:
    """A ``delivery.failed`` entry for a failed item dropped (as the outbox writes one)."""
    data: dict[str, Any] = {"outbox_id": r.id, "kind": r.kind, "detail": DROPPED}
    if r.kind == "contract":
        data.update(type=r.type, id=r.message_id, peer=r.peer)
    else:
        data["to"] = r.rcpt_to
    return data
