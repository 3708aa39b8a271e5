"""The queries behind the read side (:mod:`masd.read.case_views`), rows as stored."""

from __future__ import annotations

from functools import cache
from typing import Any

from masd.store.backend import Dialect
from masd.store.sql import Tx, dialect, one, rows


def case(tx: Tx, key: str) -> dict[str, Any] | None:
    """Every column of case ``key``."""
    return one(tx, "SELECT * FROM cases WHERE key = ?", (key,))


def handoffs(tx: Tx, key: str) -> list[dict[str, Any]]:
    """Every column of each handoff of case ``key``, in the order requested."""
    order = dialect(tx).row_order("handoff_id")
    return rows(
        tx,
        f"SELECT * FROM handoffs WHERE case_key = ? ORDER BY requested_at, {order}",  # noqa: S608
        (key,),
    )


def latest_cases(tx: Tx, limit: int, domain: str | None) -> list[dict[str, Any]]:
    """The newest cases first (of ``domain`` if given), each with its latest handoff."""
    return rows(tx, _latest_cases(dialect(tx)), (domain, domain, limit))


@cache
def _latest_cases(d: Dialect) -> str:
    h, c = d.row_order("handoff_id"), d.row_order("key")
    return (
        "SELECT c.key, c.address, c.domain, c.type, c.role, c.participant, c.created_at, "  # noqa: S608 - dialect words only
        f"c.thread_seq, h.handoff_id, h.mode, h.status FROM cases c "
        f"LEFT JOIN handoffs h ON h.{h} = (SELECT {h} FROM handoffs WHERE case_key = c.key "
        f"ORDER BY requested_at DESC, {h} DESC LIMIT 1) "
        f"WHERE {d.param('TEXT')} IS NULL OR c.domain = ? "
        f"ORDER BY c.created_at DESC, c.{c} DESC LIMIT ?"
    )


def open_handoffs(tx: Tx) -> list[dict[str, Any]]:
    """Every handoff not closed yet, oldest first."""
    return rows(
        tx,
        "SELECT h.handoff_id, h.case_key, c.role, h.mode, h.status FROM handoffs h "  # noqa: S608
        "JOIN cases c ON c.key = h.case_key WHERE h.closed_at IS NULL "
        f"ORDER BY h.requested_at, h.{dialect(tx).row_order('handoff_id')}",
    )


def pending_outbox(tx: Tx) -> list[dict[str, Any]]:
    """Every outbox row still to be delivered, in queue order."""
    return rows(
        tx,
        "SELECT id, kind, case_key, peer, attempts, last_error FROM outbox "
        "WHERE state = 'pending' ORDER BY id",
    )
