"""The mail itself and the intakes as JSON (docs/protocol.md §16.8, §16.9).

``message_json`` is the body of ``GET /mas/v0.1/messages/{ref}``; ``intakes_json`` of
``GET /mas/v0.1/intakes``.  Each runs inside one store read job.  The bytes of a message
and of its attachments are :mod:`masd.read.message_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from masd.core.times import rfc3339
from masd.read.access import Owned
from masd.store import Tx
from masd.store import message_reads as reads
from masd.store.messages import event_of

#: ``limit`` of a page of intakes: default and largest.
DEFAULT_INTAKES: Final = 100
MAX_INTAKES: Final = 1000
INTAKE_STATES: Final = ("pending", "assigned")
_CURSOR: Final = "i"


@dataclass(frozen=True)
class Message:
    """A message as the read side shows it, and what it belongs to (for :mod:`access`)."""

    owner: Owned
    doc: dict[str, Any]

    @property
    def event(self) -> dict[str, Any]:
        event: dict[str, Any] = self.doc["message"]["event"]
        return event


def message(tx: Tx, message_ref: str) -> Message | None:
    """``{"message": {...}}`` for ``message_ref``, with its owner; None if no such message."""
    row = reads.message(tx, message_ref)
    if row is None:
        return None
    case = None if row["address"] is None else {"address": row["address"], "key": row["case_key"]}
    doc = {
        "message": {
            "message_ref": row["message_ref"],
            "case": case,
            "intake_ref": row["intake_ref"],
            "received_at": rfc3339(row["received_at"]),
            "size": row["size"],
            "sha256": row["sha256"],
            "event": event_of(row["event"]),
        }
    }
    return Message(Owned(row["domain"] or "", row["type"] or ""), doc)


def intake_cursor(pos: int) -> str:
    return f"{_CURSOR}{pos}"


def parse_intake_cursor(text: str) -> int | None:
    """The position in an intake cursor, or None when ``text`` is not one."""
    digits = text[len(_CURSOR) :]
    ok = text.startswith(_CURSOR) and digits.isascii() and digits.isdigit()
    return int(digits) if ok and len(digits) <= 18 else None


def _intake_item(r: reads.IntakeRow) -> dict[str, Any]:
    case = None if r.case_key is None else {"address": r.address, "key": r.case_key}
    return {
        "intake_ref": r.intake_ref,
        "domain": r.domain,
        "type": r.type,
        "message_ref": r.message_ref,
        "requested_mode": r.requested_mode,
        "created_at": rfc3339(r.created_at),
        "assigned_at": rfc3339(r.assigned_at),
        "case": case,
    }


def intakes_json(
    tx: Tx,
    *,
    state: str | None = None,
    after: int = 0,
    limit: int = DEFAULT_INTAKES,
    scope: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``{"intakes": [...], "next": cursor}``: oldest first, after the position ``after``.

    ``next`` is the cursor of the last intake shown (``after``'s own when none is), so a
    client that polls with it sees each new intake once.
    """
    found = reads.intakes(tx, state=state, after=after, limit=max(1, limit), scope=scope)
    last = found[-1].pos if found else after
    return {"intakes": [_intake_item(r) for r in found], "next": intake_cursor(last)}
