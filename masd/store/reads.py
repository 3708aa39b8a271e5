"""The queries behind the read side (:mod:`masd.read.case_views`), rows as stored."""

from __future__ import annotations

from typing import Any

from masd.store.sql import Tx, one, rows


def case(tx: Tx, key: str) -> dict[str, Any] | None:
    """Every column of case ``key``."""
    return one(tx, "SELECT * FROM cases WHERE key = ?", (key,))


def handoffs(tx: Tx, key: str) -> list[dict[str, Any]]:
    """Every column of each handoff of case ``key``, in the order requested."""
    return rows(
        tx, "SELECT * FROM handoffs WHERE case_key = ? ORDER BY requested_at, rowid", (key,)
    )


def latest_cases(tx: Tx, limit: int, domain: str | None) -> list[dict[str, Any]]:
    """The newest cases first (of ``domain`` if given), each with its latest handoff."""
    return rows(
        tx,
        "SELECT c.key, c.address, c.domain, c.type, c.role, c.participant, c.created_at, "
        "c.thread_seq, h.handoff_id, h.mode, h.status FROM cases c "
        "LEFT JOIN handoffs h ON h.rowid = (SELECT rowid FROM handoffs WHERE case_key = c.key "
        "ORDER BY requested_at DESC, rowid DESC LIMIT 1) "
        "WHERE ?1 IS NULL OR c.domain = ?1 ORDER BY c.created_at DESC, c.rowid DESC LIMIT ?2",
        (domain, limit),
    )


def open_handoffs(tx: Tx) -> list[dict[str, Any]]:
    """Every handoff not closed yet, oldest first."""
    return rows(
        tx,
        "SELECT h.handoff_id, h.case_key, c.role, h.mode, h.status FROM handoffs h "
        "JOIN cases c ON c.key = h.case_key WHERE h.closed_at IS NULL "
        "ORDER BY h.requested_at, h.rowid",
    )


def pending_outbox(tx: Tx) -> list[dict[str, Any]]:
    """Every outbox row still to be delivered, in queue order."""
    return rows(
        tx,
        "SELECT id, kind, case_key, peer, attempts, last_error FROM outbox "
        "WHERE state = 'pending' ORDER BY id",
    )
