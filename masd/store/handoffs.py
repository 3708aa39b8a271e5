"""Handoffs, their statuses and their deadlines (docs/protocol.md §14, §12)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from masd.store.sql import Tx, dialect, dumps, one, send, tuples, value


@dataclass(frozen=True)
class HandoffRow:
    """A handoff as stored; ``needs`` is what its last status asked for when
    it is negotiating, ``peer`` None for one email answered itself."""

    handoff_id: str
    case_key: str
    mode: str
    peer: str | None
    status: str
    last_seq: int | None
    forwarded: bool
    webhook_url: str | None
    needs: tuple[str, ...]


def handoff_row(row: Mapping[str, Any]) -> HandoffRow:
    """A row with the :data:`COLUMNS` of a handoff, as a HandoffRow."""
    needs: tuple[str, ...] = ()
    if row["last_data"]:
        needs = tuple(json.loads(row["last_data"]).get("needs") or ())
    return HandoffRow(
        handoff_id=row["handoff_id"],
        case_key=row["case_key"],
        mode=row["mode"],
        peer=row["peer"],
        status=row["status"],
        last_seq=row["last_seq"],
        forwarded=bool(row["forwarded"]),
        webhook_url=row["webhook_url"],
        needs=needs,
    )


#: The columns of handoff ``h`` that :func:`handoff_row` reads, with the data
#: of its last status when it is negotiating (its ``needs``).
COLUMNS = (
    "h.handoff_id, h.case_key, h.mode, h.peer, h.status, h.last_seq, h.forwarded, "
    "h.webhook_url, CASE WHEN h.status = 'negotiating' THEN (SELECT s.data FROM statuses s "
    "WHERE s.handoff_id = h.handoff_id ORDER BY s.n DESC LIMIT 1) END AS last_data"
)
_LOAD = f"SELECT {COLUMNS} FROM handoffs h WHERE h.handoff_id = ?"  # noqa: S608 (constants)


def load(tx: Tx, handoff_id: str) -> HandoffRow | None:
    row = one(tx, _LOAD, (handoff_id,))
    return handoff_row(row) if row else None


@dataclass(frozen=True)
class NewHandoff:
    """A handoff to record, at status ``requested``."""

    handoff_id: str
    case_key: str
    mode: str
    peer: str
    deadline_at: float | None
    forwarded: bool
    webhook_url: str | None
    details: Mapping[str, str]


def open_handoff(tx: Tx, h: NewHandoff, now: float) -> None:
    send(
        tx,
        "INSERT INTO handoffs (handoff_id, case_key, mode, peer, status, requested_at, "
        "deadline_at, forwarded, webhook_url, details) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            h.handoff_id,
            h.case_key,
            h.mode,
            h.peer,
            "requested",
            now,
            h.deadline_at,
            int(h.forwarded),
            h.webhook_url,
            dumps(dict(h.details)),
        ),
    )


@dataclass(frozen=True)
class NewStatus:
    """A status to record on a handoff (``terminal`` closes it)."""

    handoff_id: str
    status: str
    seq: int | None
    source: str
    data: Mapping[str, Any]
    terminal: bool


def record_status(tx: Tx, s: NewStatus, now: float) -> str:
    """Record ``s`` and move its handoff to it; returns the handoff's mode."""
    # The status's number n (1, 2, ... per handoff) is taken in the INSERT,
    # and the handoff's mode comes back from its UPDATE: two statements.
    send(
        tx,
        "INSERT INTO statuses (handoff_id, n, seq, status, source, data, at) "
        "SELECT ?, COALESCE(MAX(n), 0) + 1, ?, ?, ?, ?, ? FROM statuses WHERE handoff_id = ?",
        (s.handoff_id, s.seq, s.status, s.source, dumps(dict(s.data)), now, s.handoff_id),
    )
    (mode,) = tuples(
        tx,
        "UPDATE handoffs SET status = ?, last_seq = COALESCE(?, last_seq), "
        "closed_at = CASE WHEN ? THEN ? ELSE closed_at END WHERE handoff_id = ? RETURNING mode",
        (s.status, s.seq, s.terminal, now, s.handoff_id),
    )[0]
    return str(mode)


def due(tx: Tx, now: float, limit: int = 100) -> list[str]:
    """Open handoffs whose deadline has come, earliest first."""
    found = tuples(
        tx,
        "SELECT handoff_id FROM handoffs WHERE closed_at IS NULL AND deadline_at <= ? "
        "ORDER BY deadline_at LIMIT ?",
        (now, limit),
    )
    return [r[0] for r in found]


def next_deadline(tx: Tx, exclude: Collection[str] = ()) -> float | None:
    """The earliest deadline of an open handoff not in ``exclude``, if any."""
    if not exclude:
        at = value(
            tx,
            "SELECT MIN(deadline_at) FROM handoffs WHERE closed_at IS NULL "
            "AND deadline_at IS NOT NULL",
        )
    else:
        at = value(
            tx,
            "SELECT MIN(deadline_at) FROM handoffs WHERE closed_at IS NULL "  # noqa: S608 - dialect words only
            "AND deadline_at IS NOT NULL "
            f"AND handoff_id NOT IN {dialect(tx).json_values()}",
            (json.dumps(list(exclude)),),
        )
    return None if at is None else float(at)
