"""Deadlines: master-role handoffs that ran out of time (docs/protocol.md §11.2, §12)."""

from __future__ import annotations

from collections.abc import Collection

from masd.core.engine import master_deadline
from masd.service.apply import apply
from masd.service.runtime import Job, Runtime, Wakes
from masd.service.state import load_case, load_handoff
from masd.store import Tx, handoffs


def due_deadlines(tx: Tx, now: float, limit: int = 100) -> list[str]:
    """Open handoffs whose deadline has come, earliest first."""
    return handoffs.due(tx, now, limit)


def next_deadline(tx: Tx, exclude: Collection[str] = ()) -> float | None:
    """The earliest deadline of an open handoff not in ``exclude``, if any."""
    return handoffs.next_deadline(tx, exclude)


def fire_deadline(rt: Runtime, tx: Tx, handoff_id: str, now: float) -> Wakes | None:
    """docs/protocol.md §11.2 / §12 for one handoff: what it woke, or None if nothing was due."""
    handoff = load_handoff(rt, tx, handoff_id)
    if handoff is None or handoff.closed:
        return None
    case = load_case(rt, tx, handoff.case_key)
    assert case is not None
    # Where several hosts write, loading the case waited for its row: the handoff is read
    # again as the job it waited for left it (another host may have fired it meanwhile).
    handoff = load_handoff(rt, tx, handoff_id)
    if handoff is None or handoff.closed:
        return None
    job = Job(rt, tx, now)
    return apply(job, case, master_deadline(case, handoff, job.context())).wakes
