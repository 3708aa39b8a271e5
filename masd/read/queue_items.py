"""The outbound queue as an operator sees it (``masd queue``, docs/protocol.md §16.7).

In the spirit of ``postqueue -p``: what waits to go out (``queued``,
``retrying``) and what masd gave up on (``failed``), as the JSON of
``GET /mas/v0.1/admin/outbox``.  Retrying and dropping an item are
:mod:`masd.service.queue_actions`.
"""

from __future__ import annotations

from typing import Any, Final

from masd.core.event import decode_words, parse_headers
from masd.core.times import rfc3339
from masd.store import Tx
from masd.store import queue_rows as rows
from masd.store.queue_rows import QueueRow

#: ``limit`` of a queue listing: default and largest over HTTP.
DEFAULT_ITEMS: Final = 100
MAX_ITEMS: Final = 1000


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
