"""The outbox's outcomes: what a delivery attempt leaves behind (docs/protocol.md §10).

The rows themselves are queued by :func:`masd.service.apply.apply` and read
by :mod:`masd.edges.outbox` through the queries below
(:mod:`masd.edges.outbox_heads` says when each is asked).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from masd.core.engine import Effect, request_failed
from masd.core.slave import slave_request_failed
from masd.service.apply import apply
from masd.service.runtime import NO_WAKES, Job, Runtime, Wakes
from masd.service.state import load_case, load_handoff
from masd.store import OutboxItem, Tx, append_thread
from masd.store import outbox as rows

# How the outbox sender finds due queue heads (masd/edges/outbox_heads.py).
outbox_after = rows.heads_after
outbox_fell_due = rows.heads_fell_due
outbox_heads = rows.heads_of_queues
outbox_peer_heads = rows.heads_of_peers
outbox_start_id = rows.start_id
next_outbox_at = rows.next_due_at
#: Where several hosts share the store, a row is sent by the host holding its lease.
outbox_claim = rows.claim
#: ... and renewed while the send lasts, so that no send outlives its lease.
outbox_renew = rows.renew
#: ... and the rows of a host that stopped renewing are found again by the others.
outbox_orphans = rows.orphaned_queues


def outbox_done(tx: Tx, item_id: int, now: float) -> None:
    rows.done(tx, item_id, at=now)


#: The relay's ``250`` for a mail, recorded at once in a transaction of its own.
outbox_relayed = rows.relayed


def outbox_done_many(tx: Tx, item_ids: Sequence[int], now: float) -> None:
    """Several rows delivered: one job for the sends that ended together."""
    rows.done_many(tx, item_ids, at=now)


def backoff(attempts: int, rng: random.Random | None = None) -> float:
    """docs/protocol.md §10: "exponential backoff from 1 s to 5 min with jitter"."""
    base = min(300.0, 2.0 ** max(0, attempts - 1))
    return base * (0.5 + (rng or random).random() / 2)


def outbox_retry(
    rt: Runtime, tx: Tx, item: OutboxItem, error: str, now: float
) -> tuple[bool, Wakes]:
    """A failure worth retrying; gives up (and fails the item) after ``retry_for``.

    Returns whether the item is kept for another attempt, and what failing it woke.
    """
    next_at = now + backoff(item.attempts + 1)
    if next_at > item.deliver_until:
        error = f"gave up after {item.attempts + 1} attempts: {error}"
        return False, outbox_failed(rt, tx, item, error, now)
    rows.retry_at(tx, item.id, error[:1000], next_at)
    return True, NO_WAKES


def outbox_failed(rt: Runtime, tx: Tx, item: OutboxItem, detail: str, now: float) -> Wakes:
    """docs/protocol.md §10: "4xx: not retried; recorded in the thread as a failed delivery
    (a refused handoff.request records failed with the detail and resumes by
    email)".  Returns what it woke (a resume mail, a status to the master)."""
    rows.failed(tx, item.id, detail[:1000], at=now)
    if not item.case_key:
        return NO_WAKES
    case = load_case(rt, tx, item.case_key)
    if case is None:
        return NO_WAKES
    data: dict[str, Any] = {"outbox_id": item.id, "kind": item.kind, "detail": detail[:1000]}
    effects: list[Effect] = []
    if item.kind == "contract":
        message = json.loads(item.payload)
        data.update(type=message.get("type"), id=message.get("id"), peer=item.peer)
        if message.get("type") == "handoff.request":
            handoff = load_handoff(rt, tx, message.get("handoff_id", ""))
            if handoff is not None and case.role == "slave":
                # docs/protocol.md §13.3-§13.4: no resume mail; the master is told.
                master = rt.master_of(case.domain, case.type)
                effects = slave_request_failed(case, handoff, detail, master=master)
            elif handoff is not None:
                effects = request_failed(case, handoff, detail)
    else:
        data["to"] = json.loads(item.payload).get("rcpt_to")
    append_thread(tx, case.key, "delivery.failed", data, at=now)
    return apply(Job(rt, tx, now), case, effects).wakes
