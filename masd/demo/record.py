"""What the demo reads of masd's record, through the read side (:mod:`masd.read.case_views`).

Each function takes the store's read transaction and runs inside one read job
(``await store.read(case_pages)``), like the read side's own functions.
"""

from __future__ import annotations

from typing import Any

from masd.cli.text import format_case
from masd.read.case_views import MAX_LIMIT, case_json, open_work, thread_json
from masd.store import Tx, reads

__all__ = [
    "case_pages",
    "handoffs",
    "open_handoffs",
    "refused_sends",
    "settled",
    "unsettled",
]

#: More cases than the demo ever opens.
_CASES = 1000


def _cases(db: Tx, role: str | None) -> list[dict[str, Any]]:
    """The cases in the order they were opened (of ``role``, or all)."""
    found = reversed(reads.latest_cases(db, _CASES, None))
    return [c for c in found if role is None or c["role"] == role]


def _entries(db: Tx, key: str) -> list[dict[str, Any]]:
    thread = thread_json(db, key, limit=MAX_LIMIT) or {}
    return list(thread.get("entries", []))


def case_pages(db: Tx, role: str | None = None) -> list[str]:
    """Each case's page as ``masd case show`` prints it, oldest case first."""
    pages = []
    for c in _cases(db, role):
        case = case_json(db, c["key"])
        if case is not None:
            pages.append(format_case(case, thread_json(db, c["key"], limit=MAX_LIMIT)))
    return pages


def handoffs(db: Tx, role: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(case key, handoff) for every handoff of the cases of ``role``."""
    out = []
    for c in _cases(db, role):
        case = case_json(db, c["key"]) or {"case": {"handoffs": []}}
        out += [(c["key"], h) for h in case["case"]["handoffs"]]
    return out


def open_handoffs(db: Tx, role: str | None = None) -> list[str]:
    """A line for each handoff not closed yet."""
    return [
        f"open: handoff {h['handoff_id'][:8]} ({h['mode']}) of {key} is {h['status']}"
        for key, h in handoffs(db, role)
        if h["closed_at"] is None
    ]


def settled(db: Tx, role: str | None = None) -> bool:
    """Every handoff of ``role``'s cases closed, and nothing left to send."""
    return not open_handoffs(db, role) and not open_work(db)["outbox"]


def unsettled(db: Tx) -> list[str]:
    """What keeps masd from being settled: open handoffs, then pending deliveries."""
    return open_handoffs(db) + [
        f"pending: outbox row {row['id']} ({row['kind']} for {row['case_key']}), "
        f"{row['attempts']} attempts, last error {row['last_error']}"
        for row in open_work(db)["outbox"]
    ]


def refused_sends(db: Tx, reason: str) -> int:
    """How many ``mail.refused`` thread entries carry ``reason``, over every case."""
    return sum(
        1
        for c in _cases(db, None)
        for entry in _entries(db, c["key"])
        if entry["kind"] == "mail.refused" and entry.get("reason") == reason
    )
