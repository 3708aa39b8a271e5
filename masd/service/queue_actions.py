"""The outbound queue as an operator sees and steers it (``masd queue``, docs/protocol.md §16.7).

In the spirit of ``postqueue -p`` and ``postsuper``: list what waits to go
out (``queued``, ``retrying``) and what masd gave up on (``failed``), retry
an item now, or drop it.

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

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from masd.core.errors import MasdError
from masd.core.event import decode_words, parse_headers
from masd.read.case_views import rfc3339
from masd.service import NO_WAKES, Runtime, Wakes, outbox_failed
from masd.store import Tx, append_thread
from masd.store import queue_rows as rows
from masd.store.queue_rows import QueueRow

#: The detail of a dropped item, in its ``delivery.failed`` entry and as its last error.
DROPPED: Final = "dropped by the operator"
#: ``limit`` of a queue listing: default and largest over HTTP.
DEFAULT_ITEMS: Final = 100
MAX_ITEMS: Final = 1000


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
    """What a retry or a drop did: the item afterwards, and what it woke."""

    item: dict[str, Any]
    wakes: Wakes


def _headers(head: str | None) -> dict[str, str]:
    if not head:
        return {}
    text = head.split("\r\n\r\n", 1)[0].encode("utf-8", "surrogateescape")
    found: dict[str, str] = {}
    for name, value in parse_headers(text + b"\r\n\r\n"):
        found.setdefault(name.lower(), value.strip())
    return found


def state_of(r: QueueRow) -> str:
    """``queued``, ``retrying`` or ``failed`` (docs/protocol.md §16.3)."""
    if r.state == "pending":
        return "retrying" if r.attempts else "queued"
    return "failed" if r.state in ("failed", "abandoned") else "sent"


def item_json(r: QueueRow) -> dict[str, Any]:
    """One item: what it is, where it goes, and how its delivery stands."""
    out: dict[str, Any] = {
        "id": r.id,
        "kind": r.kind,
        "case": r.case_key,
        "peer": r.peer,
        "state": state_of(r),
        "attempts": r.attempts,
        "last_error": r.last_error,
        "created_at": rfc3339(r.created_at),
        "next_attempt_at": rfc3339(r.next_attempt_at) if r.state == "pending" else None,
        "done_at": rfc3339(r.done_at),
    }
    if r.kind == "contract":
        out.update(type=r.type, message_id=r.message_id)
    else:
        headers = _headers(r.head)
        subject = headers.get("subject")
        out.update(
            to=r.rcpt_to,
            message_id=headers.get("message-id"),
            subject=decode_words(subject) if subject is not None else None,
        )
    return out


def listing(tx: Tx, limit: int = DEFAULT_ITEMS) -> dict[str, Any]:
    """``{"items": [...]}``: waiting items, then failed ones, each oldest first."""
    return {"items": [item_json(r) for r in rows.listed(tx, max(1, limit))]}


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
    return Done(item_json(after), wake_queues(r.queue))


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
    return Done(item_json(after), wakes | wake_queues(r.queue))


def _failed_entry(r: QueueRow) -> dict[str, Any]:
    """A ``delivery.failed`` entry for a failed item dropped (as the outbox writes one)."""
    data: dict[str, Any] = {"outbox_id": r.id, "kind": r.kind, "detail": DROPPED}
    if r.kind == "contract":
        data.update(type=r.type, id=r.message_id, peer=r.peer)
    else:
        data["to"] = r.rcpt_to
    return data


# --------------------------------------------------------------------------- text


_COLUMNS: Final = ("ID", "STATE", "ATTEMPTS", "CREATED", "NEXT TRY", "CASE", "WHAT")


def _what(item: dict[str, Any]) -> str:
    if item["kind"] == "contract":
        return f"{item.get('type')} {item.get('message_id')} to {item.get('peer')}"
    return f"mail {item.get('message_id') or '(no Message-ID)'} to {item.get('to')}"


def format_items(items: Sequence[dict[str, Any]]) -> str:
    """``masd queue``: a header row, one row per item, its last error on the next line."""
    table = [list(_COLUMNS)]
    errors: list[str | None] = [None]
    for it in items:
        table.append(
            [
                str(it["id"]),
                it["state"],
                str(it["attempts"]),
                str(it["created_at"]),
                str(it["next_attempt_at"] or "-"),
                str(it["case"] or "-"),
                _what(it),
            ]
        )
        errors.append(it.get("last_error"))
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS) - 1)]
    lines = []
    for r, error in zip(table, errors, strict=True):
        cells = [v.ljust(w) for v, w in zip(r, widths, strict=False)] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
        if error:
            lines.append(f"    last error: {json.dumps(error, ensure_ascii=False)[:300]}")
    count = len(items)
    lines.append(f"{count} item{'' if count == 1 else 's'}")
    return "\n".join(lines) + "\n"
