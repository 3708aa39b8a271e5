"""Answers kept per (peer, id), so a repeated contract message gets the same one (docs/protocol.md
§9)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from masd.store.backend import Raced
from masd.store.sql import Tx, dumps, one, tuples


def answered(tx: Tx, peer: str, message_id: str) -> tuple[int, Any] | None:
    """The (status, body) kept for this (peer, id), if the message was received before."""
    kept = one(
        tx, "SELECT status, body FROM idempotency WHERE peer = ? AND id = ?", (peer, message_id)
    )
    if kept is not None:
        return int(kept["status"]), json.loads(kept["body"])
    return None


def keep(
    tx: Tx, peer: str, message_id: str, status: int, body: Mapping[str, Any], now: float
) -> None:
    """Keep the answer to (peer, id), by its unique key: where another host kept one
    first (received the same message at the same time), this job is run again and
    then finds that answer (:class:`~masd.store.backend.Raced`)."""
    kept = tuples(
        tx,
        "INSERT INTO idempotency (peer, id, status, body, at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (peer, id) DO NOTHING RETURNING peer",
        (peer, message_id, status, dumps(dict(body)), now),
    )
    if not kept:
        raise Raced(f"an answer to ({peer}, {message_id}) was kept by another writer first")
