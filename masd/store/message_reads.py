"""The queries behind the mail itself and the pending intakes (docs/protocol.md §16.8-§16.10).

A recorded message as the read side shows it (:func:`message`), its raw bytes whole
(:func:`raw_whole`) or a range of them (:func:`raw_range`), read through SQLite's
incremental blob I/O so a range costs its own length, not the message's; the intakes
(:func:`intakes`); and the case list and event feed limited to some (domain, type)
pairs, for a reader entitled to those only (:func:`scoped_cases`, :func:`scoped_events`).

A scope is a sequence of ``"domain/type"`` strings.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from masd.store.backend import SQLITE
from masd.store.entries import EntryRow, ListedCase, _entries, _entry
from masd.store.sql import Tx, dialect, dumps, one, rows, tuples


def message(tx: Tx, message_ref: str) -> dict[str, Any] | None:
    """A recorded message, with its case's address and the domain and type it was
    received for (its case's, or its intake's while pending)."""
    return one(
        tx,
        "SELECT m.message_ref, m.case_key, m.intake_ref, m.received_at, m.size, m.sha256, "
        "m.event, c.address, COALESCE(c.domain, i.domain) AS domain, "
        "COALESCE(c.type, i.type) AS type FROM messages m "
        "LEFT JOIN cases c ON c.key = m.case_key "
        "LEFT JOIN intakes i ON i.intake_ref = m.intake_ref WHERE m.message_ref = ?",
        (message_ref,),
    )


def _blob(tx: Tx, message_ref: str) -> sqlite3.Blob | None:
    """SQLite's incremental reader of the message's raw bytes (None: no such message)."""
    row = one(tx, "SELECT rowid AS r FROM messages WHERE message_ref = ?", (message_ref,))
    if row is None:
        return None
    conn: sqlite3.Connection = cast(Any, tx).conn
    return conn.blobopen("messages", "raw", int(row["r"]), readonly=True)


def raw_whole(tx: Tx, message_ref: str) -> bytes | None:
    """The raw bytes of ``message_ref`` (None: no such message), copied once."""
    if dialect(tx) is not SQLITE:
        row = one(tx, "SELECT raw FROM messages WHERE message_ref = ?", (message_ref,))
        return None if row is None else bytes(row["raw"])
    blob = _blob(tx, message_ref)
    if blob is None:
        return None
    with blob:
        return blob.read()


def raw_range(tx: Tx, message_ref: str, offset: int, length: int) -> bytes | None:
    """At most ``length`` raw bytes of ``message_ref`` from ``offset``; None: no such message."""
    if dialect(tx) is not SQLITE:  # substr of a bytea reads only what it returns
        row = one(
            tx,
            "SELECT substr(raw, ?, ?) AS part FROM messages WHERE message_ref = ?",
            (offset + 1, length, message_ref),
        )
        return None if row is None else bytes(row["part"])
    blob = _blob(tx, message_ref)
    if blob is None:
        return None
    with blob:
        if offset >= len(blob):
            return b""
        blob.seek(offset)
        return blob.read(length)


@dataclass(frozen=True)
class IntakeRow:
    pos: int
    intake_ref: str
    domain: str
    type: str
    message_ref: str
    requested_mode: str | None
    created_at: float
    assigned_at: float | None
    case_key: str | None
    address: str | None


def _scope(scope: Sequence[str] | None) -> str | None:
    """A scope as the queries take it: a JSON array, compared with ``json_each``."""
    return None if scope is None else dumps(list(scope))


def intakes(
    tx: Tx, *, state: str | None, after: int, limit: int, scope: Sequence[str] | None
) -> list[IntakeRow]:
    """Intakes in the order they were recorded, after the position ``after``.

    ``state``: ``pending`` (not assigned yet), ``assigned``, or None for both.
    """
    found = rows(
        tx,
        "SELECT i.rowid AS pos, i.intake_ref, i.domain, i.type, i.message_ref, "
        "i.requested_mode, i.created_at, i.assigned_at, i.case_key, c.address FROM intakes i "
        "LEFT JOIN cases c ON c.key = i.case_key WHERE i.rowid > ? "
        "AND (? IS NULL OR i.domain || '/' || i.type IN (SELECT value FROM json_each(?))) "
        "AND (? IS NULL OR (i.case_key IS NULL) = (? = 'pending')) ORDER BY i.rowid LIMIT ?",
        (after, _scope(scope), _scope(scope), state, state, limit),
    )
    return [IntakeRow(**r) for r in found]


def scoped_events(
    tx: Tx, after: int, limit: int, case_key: str | None, scope: Sequence[str]
) -> list[EntryRow]:
    """:func:`masd.store.entries.events` of the cases in ``scope`` only."""
    found = tuples(
        tx,
        _entries(dialect(tx))  # noqa: S608 (dialect words only: the values are parameters)
        + "WHERE t.pos > ? AND (? IS NULL OR t.case_key = ?) "
        "AND c.domain || '/' || c.type IN (SELECT value FROM json_each(?)) "
        "ORDER BY t.pos LIMIT ?",
        (after, case_key, case_key, _scope(scope), limit),
    )
    return [_entry(r) for r in found]


def scoped_cases(
    tx: Tx,
    *,
    before: int | None,
    limit: int,
    open_handoff: bool | None,
    participant: str | None,
    domain: str | None,
    scope: Sequence[str],
) -> list[ListedCase]:
    """:func:`masd.store.entries.cases` of the cases in ``scope`` only."""
    found = tuples(
        tx,
        "SELECT c.key, c.address, c.domain, c.type, c.role, c.participant, c.created_at, "
        "t.pos, t.at, h.handoff_id, h.mode, h.status "
        "FROM thread t CROSS JOIN cases c "
        "LEFT JOIN handoffs h ON h.rowid = (SELECT rowid FROM handoffs WHERE case_key = c.key "
        "AND closed_at IS NULL ORDER BY requested_at DESC, rowid DESC LIMIT 1) "
        "WHERE c.key = t.case_key AND c.thread_seq = t.seq AND t.pos < ? "
        "AND (? IS NULL OR ? = (h.handoff_id IS NOT NULL)) "
        "AND (? IS NULL OR c.participant = ? COLLATE NOCASE) "
        "AND (? IS NULL OR c.domain = ?) "
        "AND c.domain || '/' || c.type IN (SELECT value FROM json_each(?)) "
        "ORDER BY t.pos DESC LIMIT ?",
        (
            2**63 - 1 if before is None else before,
            open_handoff,
            open_handoff,
            participant,
            participant,
            domain,
            domain,
            _scope(scope),
            limit,
        ),
    )
    return [
        ListedCase(
            key=str(r[0]),
            address=str(r[1]),
            domain=str(r[2]),
            type=str(r[3]),
            role=str(r[4]),
            participant=r[5],
            created_at=float(r[6]),
            last_pos=int(r[7]),
            last_at=float(r[8]),
            open_handoff=None if r[9] is None else (str(r[9]), str(r[10]), str(r[11])),
        )
        for r in found
    ]
