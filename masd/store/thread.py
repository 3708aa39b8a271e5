"""A case's thread: the append-only log of everything that happened on it (docs/protocol.md §16)."""

from __future__ import annotations

from collections.abc import Mapping

from masd.core.errors import MasdError
from masd.core.kinds import THREAD_KINDS
from masd.store.backend import Raced
from masd.store.sql import Tx, dialect, dumps, send, tuples


def append_thread(
    tx: Tx, case_key: str, kind: str, data: Mapping[str, object], *, at: float
) -> int:
    """Append one entry to a case's thread and return its per-case ``seq``.

    ``seq`` comes from ``cases.thread_seq``, bumped in the same job, so seqs
    are 1, 2, ... per case with no gaps and no reuse.
    """
    if kind not in THREAD_KINDS:
        raise MasdError(
            f"thread kind {kind!r} is not one of {sorted(THREAD_KINDS)}", code="bad-thread-kind"
        )
    bumped = tuples(tx, _BUMP[dialect(tx).lock_rows], (case_key,))
    if not bumped:
        raise MasdError(f"no case {case_key!r} to append a {kind} entry to", code="unknown-case")
    seq = int(bumped[0][0])
    if not bumped[0][1]:
        raise Raced(f"case {case_key}: an entry of a later transaction came first")
    send(
        tx,
        "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, ?, ?, ?)",
        (case_key, seq, kind, float(at), dumps(dict(data))),
    )
    return seq


#: The case's next ``seq``, and whether this entry may follow its latest one.  Where
#: several hosts write, a position is made from its writer's transaction id
#: (masd/store/pg_backend.py): a job given its id before it waited for the case's row
#: must not put an entry behind one of a later id, so it is run again (a new id).
_BUMP = {
    False: "UPDATE cases SET thread_seq = thread_seq + 1 WHERE key = ? RETURNING thread_seq, 1",
    True: (
        "UPDATE cases SET thread_seq = thread_seq + 1, "
        "thread_xid = GREATEST(thread_xid, pg_current_xact_id()) WHERE key = ? "
        "RETURNING thread_seq, thread_xid = pg_current_xact_id()"
    ),
}


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
