"""A case's thread: the append-only log of everything that happened on it (docs/protocol.md §16)."""

from __future__ import annotations

from collections.abc import Mapping

from masd.core.errors import MasdError
from masd.core.kinds import THREAD_KINDS
from masd.store.sql import Tx, dialect, dumps, run, send, tuples


def append_thread(
    tx: Tx, case_key: str, kind: str, data: Mapping[str, object], *, at: float
) -> None:
    """Append one entry to a case's thread.

    Its per-case ``seq`` comes from ``cases.thread_seq``, bumped in the same
    job, so seqs are 1, 2, ... per case with no gaps and no reuse.  It is one
    statement on either backend.  Where several hosts write, its result is not
    read (sent with the job's next, pipeline mode): a case that is not there
    fails it (``seq`` cannot be null), and an entry that may not follow the
    case's latest fails it as a race (:data:`_APPEND`).  With one writer, the
    entry goes in only where its case is (:data:`_APPEND_ONE`).
    """
    if kind not in THREAD_KINDS:
        raise MasdError(
            f"thread kind {kind!r} is not one of {sorted(THREAD_KINDS)}", code="bad-thread-kind"
        )
    if dialect(tx).lock_rows:
        send(tx, _APPEND, (case_key, case_key, kind, float(at), dumps(dict(data))))
        return
    if run(tx, _APPEND_ONE, (kind, float(at), dumps(dict(data)), case_key)) != 1:
        raise MasdError(f"no case {case_key!r} to append a {kind} entry to", code="unknown-case")


#: One writer (SQLite): the entry's ``seq`` is one past its case's, and the trigger of
#: migration 8 (masd/store/schema.py) moves the case's ``thread_seq`` up to it.
_APPEND_ONE = (
    "INSERT INTO thread (case_key, seq, kind, at, data) "
    "SELECT key, thread_seq + 1, ?, ?, ? FROM cases WHERE key = ?"
)

#: Where several hosts write: bump the case's ``seq`` and insert the entry, in one statement.
#: A position is made from its writer's transaction id (masd/store/pg_backend.py): a job
#: given its id before it waited for the case's row must not put an entry behind one of a
#: later id, so it fails as a race and is run again (a new id).
_APPEND = (
    "WITH b AS (UPDATE cases SET thread_seq = thread_seq + 1, "
    "thread_xid = GREATEST(thread_xid, pg_current_xact_id()) WHERE key = ? "
    "RETURNING thread_seq, thread_xid = pg_current_xact_id() AS ok) "
    "INSERT INTO thread (case_key, seq, kind, at, data) "
    "SELECT ?, CASE WHEN b.ok IS NOT FALSE THEN b.thread_seq "
    "ELSE masd_raced('an entry of a later transaction came first') END, ?, ?, ? "
    "FROM (SELECT 1) one LEFT JOIN b ON TRUE"
)


def reported_request(tx: Tx, case_key: str, handoff_id: str) -> bool:
    """Whether the case's thread has a ``handoff.requested`` for ``handoff_id``
    queued to the master (a ``!MODE`` reported on a slave case).

    Read through the case's own entries (the thread's key starts with
    ``case_key``), so the cost is that of one case's thread.
    """
    d = dialect(tx)
    found = tuples(
        tx,
        "SELECT 1 FROM thread WHERE case_key = ? AND kind = 'contract.out' "  # noqa: S608
        f"AND {d.json_get('data', 'type')} = 'handoff.requested' "
        f"AND {d.json_get('data', 'handoff_id')} = ? LIMIT 1",
        (case_key, handoff_id),
    )
    return bool(found)
