"""Cases past their type's ``retain``, and removing a case with everything it holds.

Plain SQL that both backends speak (``?`` placeholders, no rowid, no
upsert): a case is found by its latest thread entry (``cases.thread_seq``
names it, so finding it is one index lookup), and removed table by table in
the order the foreign keys need (statuses, handoffs, thread, messages,
intakes, outbox rows, then the case).

The case that holds the store's latest thread entry is never expired: the
feed's positions are the thread's keys, and SQLite gives a new row the
largest key plus one, so deleting the latest entry would hand its position
out again (a client that saw it would then miss the next one).
"""

from __future__ import annotations

from masd.store.backend import Raced
from masd.store.sql import Tx, dialect, dumps, many, run, send, tuples, value

#: What :func:`remove_case` removes, table by table (its counts' keys).
TABLES = ("statuses", "handoffs", "thread", "messages", "intakes", "outbox", "cases")


def expired_cases(tx: Tx, domain: str, type_: str, before: float, limit: int) -> list[str]:
    """Keys of up to ``limit`` cases of ``domain``/``type_`` whose latest thread entry
    is older than ``before`` and which have no open handoff."""
    found = tuples(
        tx,
        "SELECT c.key FROM cases c JOIN thread t ON t.case_key = c.key AND t.seq = c.thread_seq "
        "WHERE c.domain = ? AND c.type = ? AND t.at < ? "
        "AND t.pos < (SELECT MAX(pos) FROM thread) "
        "AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.case_key = c.key "
        "AND h.closed_at IS NULL) ORDER BY t.pos LIMIT ?",
        (domain, type_, before, limit),
    )
    return [str(k) for (k,) in found]


def still_expired(tx: Tx, key: str, before: float) -> bool:
    """Case ``key`` is (still, inside this write) past ``before`` with no open handoff."""
    found = value(
        tx,
        "SELECT COUNT(*) FROM cases c JOIN thread t ON t.case_key = c.key "
        "AND t.seq = c.thread_seq WHERE c.key = ? AND t.at < ? "
        "AND t.pos < (SELECT MAX(pos) FROM thread) "
        "AND NOT EXISTS (SELECT 1 FROM handoffs h WHERE h.case_key = c.key "
        "AND h.closed_at IS NULL)",
        (key, before),
    )
    return bool(found)


def remove_case(tx: Tx, key: str, *, keep_pending_contract: bool = False) -> dict[str, int]:
    """Delete case ``key`` and every row of it; the rows removed per table.

    ``keep_pending_contract``: contract messages not yet delivered stay in the
    outbox (a ``handoff.cancel`` queued just before) and go out all the same.
    """
    counts = dict.fromkeys(TABLES, 0)
    counts["statuses"] = run(
        tx,
        "DELETE FROM statuses WHERE handoff_id IN "
        "(SELECT handoff_id FROM handoffs WHERE case_key = ?)",
        (key,),
    )
    counts["handoffs"] = run(tx, "DELETE FROM handoffs WHERE case_key = ?", (key,))
    sent = _outbox_ids(tx, key)
    counts["thread"] = run(
        tx, "DELETE FROM thread WHERE case_key = ? AND kind <> 'case.erased'", (key,)
    )
    counts["messages"] = run(tx, "DELETE FROM messages WHERE case_key = ?", (key,))
    counts["intakes"] = run(tx, "DELETE FROM intakes WHERE case_key = ?", (key,))
    keep = " AND NOT (state = 'pending' AND kind = 'contract')" if keep_pending_contract else ""
    counts["outbox"] = run(
        tx,
        "DELETE FROM outbox WHERE case_key = ?" + keep,  # noqa: S608 - fixed words only
        (key,),
    )
    # What was kept of delivered rows (now, and by the trigger as they were deleted).
    many(tx, "DELETE FROM outbox_sent WHERE id = ?", [(i,) for i in sorted(sent)])
    counts["cases"] = run(tx, "DELETE FROM cases WHERE key = ?", (key,))
    return counts


def erase_case(tx: Tx, key: str, at: float) -> tuple[dict[str, int], int] | None:
    """Remove case ``key`` with every row of it (:func:`remove_case`), leaving one
    ``case.erased`` entry (the case's key, its address in the data); None if there
    is no such case, else the rows removed per table and the entry's position.

    The entry is written before the case's own entries go, so it takes a
    position past all of theirs even when the case held the latest one (a
    client that saw that one still sees the entry).
    """
    found = tuples(tx, _LOCK[dialect(tx).lock_rows], (key,))
    if not found:
        return None
    address, seq = str(found[0][0]), int(found[0][1])
    if not found[0][2]:
        raise Raced(f"case {key}: an entry of a later transaction came first")
    send(
        tx,
        "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, 'case.erased', ?, ?)",
        (key, seq + 1, float(at), dumps({"address": address})),
    )
    pos = int(value(tx, "SELECT pos FROM thread WHERE case_key = ? AND seq = ?", (key, seq + 1)))
    return remove_case(tx, key), pos


#: The case's address and latest ``seq``; where several hosts write, its row locked and
#: whether this transaction may write past its latest entry (masd.store.thread._APPEND).
_LOCK = {
    False: "SELECT address, thread_seq, 1 FROM cases WHERE key = ?",
    True: (
        "UPDATE cases SET thread_xid = GREATEST(thread_xid, pg_current_xact_id()) "
        "WHERE key = ? RETURNING address, thread_seq, thread_xid = pg_current_xact_id()"
    ),
}


def _outbox_ids(tx: Tx, key: str) -> set[int]:
    """The outbox rows case ``key``'s entries name, and its rows still in the outbox."""
    named = dialect(tx).json_int("data", "outbox_id")
    found = tuples(
        tx,
        f"SELECT {named} FROM thread WHERE case_key = ? "  # noqa: S608 - dialect words only
        "AND kind IN ('mail.out', 'contract.out')",
        (key,),
    )
    ids = {int(i) for (i,) in found if i is not None}
    ids |= {int(i) for (i,) in tuples(tx, "SELECT id FROM outbox WHERE case_key = ?", (key,))}
    return ids


def purge_send_log(tx: Tx, before: float, limit: int) -> int:
    """Forget up to ``limit`` sends older than ``before`` (the per-recipient cap looks
    back 24 hours and no further)."""
    return run(
        tx,
        "DELETE FROM send_log WHERE id IN (SELECT id FROM send_log WHERE at < ? LIMIT ?)",
        (before, limit),
    )
