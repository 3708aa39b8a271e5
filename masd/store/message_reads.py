"""The queries behind the mail itself and the pending intakes (docs/protocol.md §16.8-§16.10).

A recorded message as the read side shows it (:func:`message`), its raw bytes whole
(:func:`raw_whole`) or a range of them (:func:`raw_range`), read through SQLite's
incremental blob I/O so a range costs its own length, not the message's (PostgreSQL
reads a ``substr`` of the ``bytea``); the intakes (:func:`intakes`); and the case list
and event feed limited to some (domain, type) pairs, for a reader entitled to those only
(:func:`scoped_cases`, :func:`scoped_events`).

A scope is a sequence of ``"domain/type"`` strings, passed to the queries as one JSON
array parameter.  Every query here runs on both backends; only :func:`_blob` (SQLite's
blob I/O, reached only when the transaction's dialect is SQLite's) is SQLite's alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from masd.store.backend import SQLITE, Dialect
from masd.store.entries import EntryRow, ListedCase, _entries, _entry, _list_cases, listed_case
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
    """A scope as the queries take it: one parameter, a JSON array
    (:meth:`masd.store.backend.Dialect.json_values`)."""
    return None if scope is None else dumps(list(scope))


def _micros(column: str) -> str:
    """An epoch-seconds column as whole microseconds (an integer cursor)."""
    return f"CAST(round({column} * 1000000) AS BIGINT)"


@cache
def _intakes_sql(d: Dialect, ties: bool) -> str:
    """Intakes after a position (``ties``: at a position, after an ``intake_ref``)."""
    pos = "i.rowid" if d.name == "sqlite" else _micros("i.created_at")
    where = f"{pos} = ? AND i.intake_ref > ?" if ties else f"{pos} > ?"
    order = pos if d.name == "sqlite" else f"{pos}, i.intake_ref"
    return (
        f"SELECT {pos} AS pos, i.intake_ref, i.domain, i.type, i.message_ref, "  # noqa: S608 - dialect words only
        "i.requested_mode, i.created_at, i.assigned_at, i.case_key, c.address FROM intakes i "
        f"LEFT JOIN cases c ON c.key = i.case_key WHERE {where} "
        f"AND ({d.param('TEXT')} IS NULL OR i.domain || '/' || i.type IN {d.json_values()}) "
        f"AND ({d.param('TEXT')} IS NULL OR (i.case_key IS NULL) = (? = 'pending')) "
        f"ORDER BY {order} LIMIT ?"
    )


def intakes(
    tx: Tx, *, state: str | None, after: int, limit: int, scope: Sequence[str] | None
) -> list[IntakeRow]:
    """Intakes in the order they were recorded, after the position ``after``.

    ``state``: ``pending`` (not assigned yet), ``assigned``, or None for both.

    A position is SQLite's ``rowid``; on PostgreSQL, whose table has no row number,
    ``created_at`` in whole microseconds, ties ordered by ``intake_ref``.  Intakes
    recorded in one microsecond share a position, so a page never ends between two
    of them: the rest of that microsecond is added (the page may pass ``limit``),
    and a cursor taken from its last intake skips none.
    """
    d = dialect(tx)
    params = (_scope(scope), _scope(scope), state, state)
    found = rows(tx, _intakes_sql(d, False), (after, *params, limit))
    if d.name != "sqlite" and found and len(found) == limit:
        last = found[-1]
        found += rows(tx, _intakes_sql(d, True), (last["pos"], last["intake_ref"], *params, 2**62))
    return [IntakeRow(**r) for r in found]


@cache
def _scope_clause(d: Dialect) -> str:
    """An entry is in a scope by its case key's domain and type
    (:func:`masd.read.access.key_owner`), not its case's row: a ``case.erased``
    entry outlives its case."""
    if d.name == "sqlite":
        domain = "substr(t.case_key, instr(t.case_key, '@') + 1)"
        type_ = "substr(t.case_key, 1, instr(t.case_key, '=') - 1)"
    else:
        domain, type_ = "split_part(t.case_key, '@', 2)", "split_part(t.case_key, '=', 1)"
    return f"AND {domain} || '/' || {type_} IN {d.json_values()} "


def scoped_events(
    tx: Tx, after: int, limit: int, case_key: str | None, scope: Sequence[str]
) -> list[EntryRow]:
    """:func:`masd.store.entries.events` of the cases in ``scope`` only."""
    d = dialect(tx)
    found = tuples(
        tx,
        _entries(d)
        + f"WHERE t.pos > ?{d.readable('t')} AND ({d.param('TEXT')} IS NULL OR t.case_key = ?) "
        + _scope_clause(dialect(tx))
        + "ORDER BY t.pos LIMIT ?",
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
        _list_cases(dialect(tx), scoped=True),
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
    return [listed_case(r) for r in found]
