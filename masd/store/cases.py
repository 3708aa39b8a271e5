"""Cases: their rows, their ids, their policy and their send counts (Principle 10)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masd.core.engine import CaseView
from masd.store import handoffs
from masd.store.handoffs import HandoffRow, handoff_row
from masd.store.sql import Tx, dialect, dumps, one, send, tuples, value


@dataclass(frozen=True)
class CaseRow:
    """A case as stored, with its open handoff (the latest requested) if any."""

    key: str
    address: str
    domain: str
    type: str
    id: str
    role: str
    participant: str
    open_handoff: HandoffRow | None


# One statement reads the case and its open handoff (the latest requested).
_LOAD = (
    "SELECT c.key, c.address, c.domain, c.type, c.id, c.role, c.participant, "  # noqa: S608
    f"{handoffs.COLUMNS} "  # constants only
    "FROM cases c LEFT JOIN handoffs h ON h.handoff_id = (SELECT handoff_id FROM handoffs "
    "WHERE case_key = c.key AND closed_at IS NULL ORDER BY requested_at DESC LIMIT 1) "
    "WHERE c.key = ?"
)


_LOCK = "SELECT 1 AS x FROM cases WHERE key = ? FOR UPDATE"


def load(tx: Tx, key: str) -> CaseRow | None:
    """The case ``key`` and its open handoff, in one statement (where several hosts
    write, after a first that locks the case's row: under READ COMMITTED the read after
    it sees what the job it waited for committed, where one statement that locks and
    joins would join the handoff as it was before the wait)."""
    if dialect(tx).lock_rows and one(tx, _LOCK, (key,)) is None:
        return None
    row = one(tx, _LOAD, (key,))
    if row is None:
        return None
    return CaseRow(
        key=row["key"],
        address=row["address"],
        domain=row["domain"],
        type=row["type"],
        id=row["id"],
        role=row["role"],
        participant=row["participant"] or "",
        open_handoff=handoff_row(row) if row["handoff_id"] is not None else None,
    )


def exists(tx: Tx, key: str) -> bool:
    return one(tx, "SELECT 1 AS x FROM cases WHERE key = ?", (key,)) is not None


def address(tx: Tx, key: str) -> str | None:
    """The canonical address of case ``key`` (its id as first assigned), if there is one."""
    found = value(tx, "SELECT address FROM cases WHERE key = ?", (key,))
    return None if found is None else str(found)


def create(tx: Tx, case: CaseView, now: float) -> None:
    send(
        tx,
        "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at) "
        "VALUES (?,?,?,?,?,?,?,?)",
        (case.key, case.address, case.domain, case.type, case.id, case.role, case.participant, now),
    )


def next_number(tx: Tx, domain: str, type_: str) -> int:
    """Take the next master-role id number for (domain, type): 1, 2, ...

    docs/protocol.md §2: "email assigns ids ``<id_prefix><n>`` ... n = 1, 2, … per
    domain and type, never reused."  On SQLite the bump is part of the caller's
    job, so a job that rolls back gives its number back only together with the
    case that would have used it.  Where several hosts write, the number comes
    from the type's sequence (``masd_case_number``, PostgreSQL migration 6): no
    job waits for another's commit to take one, and a job that rolls back
    leaves its number unused.
    """
    if dialect(tx).lock_rows:
        return int(tuples(tx, "SELECT masd_case_number(?, ?)", (domain, type_))[0][0])
    got = tuples(
        tx,
        "INSERT INTO id_counters (domain, type, next_n) VALUES (?, ?, 2) "
        "ON CONFLICT (domain, type) DO UPDATE SET next_n = id_counters.next_n + 1 "
        "RETURNING next_n - 1",
        (domain, type_),
    )
    return int(got[0][0])


def policy(tx: Tx, key: str) -> dict[str, Any]:
    """The policy the master set on case ``key`` (empty when none)."""
    stored = value(tx, "SELECT policy FROM cases WHERE key = ?", (key,))
    return json.loads(stored) if stored else {}


def set_policy(tx: Tx, key: str, stored: Mapping[str, Any]) -> None:
    send(tx, "UPDATE cases SET policy = ? WHERE key = ?", (dumps(dict(stored)), key))


@dataclass(frozen=True)
class Standing:
    """What Principle 10 and the bounces say of one send, read by one statement."""

    case_sent: int  # mails sent on the case so far
    recipient_sent: int  # mails sent to the recipient since the window began, any case
    suppressed_until: float | None  # the recipient bounced for good: until when


def send_standing(tx: Tx, key: str, recipient: str, since: float) -> Standing:
    """Mails sent on case ``key`` so far (Principle 10's per-case cap), mails sent to
    ``recipient`` (lower case) after ``since`` on any case, and the recipient's
    suppression (:func:`masd.store.bounces.suppressed_until`), in one round trip."""
    found = tuples(
        tx,
        "SELECT (SELECT sent_count FROM cases WHERE key = ?), "
        "(SELECT COUNT(*) FROM send_log WHERE recipient = ? AND at > ?), "
        "(SELECT until FROM suppressions WHERE address = ?)",
        (key, recipient, since, recipient),
    )
    case_sent, recipient_sent, until = found[0]
    return Standing(int(case_sent), int(recipient_sent), None if until is None else float(until))


def count_send(tx: Tx, key: str, recipient: str, now: float) -> None:
    """A mail to ``recipient`` (lower case) was queued on case ``key``."""
    send(tx, "UPDATE cases SET sent_count = sent_count + 1 WHERE key = ?", (key,))
    send(
        tx,
        "INSERT INTO send_log (case_key, recipient, at) VALUES (?, ?, ?)",
        (key, recipient, now),
    )
