"""A case's thread: the append-only log of everything that happened on it (docs/protocol.md §16)."""

from __future__ import annotations

from collections.abc import Mapping

from masd.core.errors import MasdError
from masd.core.kinds import THREAD_KINDS
from masd.store.sql import Tx, dialect, dumps, send, tuples


def append_thread(
    tx: Tx, case_key: str, kind: str, data: Mapping[str, object], *, at: float
) -> None:
    """Append one entry to a case's thread.

    Its per-case ``seq`` comes from ``cases.thread_seq``, bumped in the same
    job, so seqs are 1, 2, ... per case with no gaps and no reuse.  Where
    several hosts write it is one statement whose result is not read (sent
    with the job's next, pipeline mode): a case that is not there fails it
    (``seq`` cannot be null), and an entry that may not follow the case's
    latest fails it as a race (:data:`_APPEND`).
    """
    if kind not in THREAD_KINDS:
        raise MasdError(
            f"thread kind {kind!r} is not one of {sorted(THREAD_KINDS)}", code="bad-thread-kind"
        )
    if dialect(tx).lock_rows:
        send(tx, _APPEND, (case_key, case_key, kind, float(at), dumps(dict(data))))
        return
    bumped = tuples(tx, _BUMP, (case_key,))
    if not bumped:
        raise MasdError(f"no case {case_key!r} to append a {kind} entry to", code="unknown-case")
    send(
        tx,
        "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, ?, ?, ?)",
        (case_key, int(bumped[0][0]), kind, float(at), dumps(dict(data))),
    )


_BUMP = "UPDATE cases SET thread_seq = thread_seq + 1 WHERE key = ? RETURNING thread_seq"

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
