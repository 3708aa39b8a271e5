"""The outbox: contract messages and mails waiting to go out, one queue per case and peer.

Rows are written by the job that caused them and delivered by
:mod:`masd.edges.outbox`; docs/protocol.md §10: "Messages about one case to one peer
are delivered in order", so only the head (lowest id) of a queue is due.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from masd.store.backend import Cursor, Dialect
from masd.store.sql import AfterCommit, Tx, db, dialect, dumps, lease, many, send, tuples, value


@dataclass(frozen=True)
class OutboxItem:
    id: int
    kind: str
    queue: str
    peer: str | None
    case_key: str | None
    url: str | None
    payload: str
    attempts: int
    deliver_until: float
    next_attempt_at: float = 0.0
    #: Monotonic time before which this host holds the row's lease without claiming it:
    #: it queued the row as its queue's head, leased to itself (:func:`queue_item`).
    held_until: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class NewRow:
    """A row to queue: rows of one ``queue`` are delivered in order."""

    kind: str
    queue: str
    peer: str
    case_key: str | None
    url: str | None
    payload: Mapping[str, Any]


def queue(tx: Tx, row: NewRow, now: float, deliver_until: float) -> int:
    """Queue ``row``; its outbox id (a thread entry names its row by it)."""
    return queue_item(tx, row, now, deliver_until)[0].id


class Reserved:
    """An outbox id taken ahead for a row of ``queue``, and whether that row will be its
    queue's head (:func:`reserve`)."""

    __slots__ = ("_answer", "_found", "queue")

    def __init__(self, found: Cursor, queue: str) -> None:
        self._found = found
        self._answer: tuple[int, bool] | None = None
        self.queue = queue

    def read(self) -> tuple[int, bool]:
        """(the id, whether the row will be its queue's head)."""
        if self._answer is None:
            (item_id, head), *_ = self._found.fetchall()
            self._answer = (int(item_id), bool(head))
        return self._answer


def reserve(tx: Tx, queue: str) -> Reserved:
    """The id of a row about to be queued on ``queue`` and whether it will be its queue's
    head, so that the row goes in whole, its bounce address already in its payload, in one
    statement whose answer the job need not wait for (:func:`queue_item`).

    On PostgreSQL both are asked with the job's next read (no round trip of their own), the
    id from the table's sequence, the pending row found locked as :func:`_queue_leased`
    locks it; an id reserved for a row never queued (the send was refused) is a gap, as a
    sequence leaves.  On SQLite (one writer) the id is the one ``AUTOINCREMENT`` gives next,
    read at once: no row can be queued between the reservation and its insert, since the
    job queues nothing else in between, and a reservation not used leaves no gap."""
    d = dialect(tx)
    reserved = Reserved(db(tx).execute(_reserve(d), (queue,)), queue)
    if not d.leases:
        reserved.read()
    return reserved


@cache
def _reserve(d: Dialect) -> str:
    if d.leases:
        return (
            "SELECT nextval(pg_get_serial_sequence('outbox', 'id')), NOT EXISTS "
            "(SELECT 1 FROM outbox p WHERE p.queue = ? AND p.state = 'pending' FOR SHARE)"
        )
    # AUTOINCREMENT's next id: one past the larger of its counter and the largest id.
    return (
        "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0), "
        "COALESCE((SELECT MAX(id) FROM outbox), 0)) + 1, NOT EXISTS "
        "(SELECT 1 FROM outbox p WHERE p.queue = ? AND p.state = 'pending')"
    )


def queue_item(
    tx: Tx, row: NewRow, now: float, deliver_until: float, reserved: Reserved | None = None
) -> tuple[OutboxItem, bool]:
    """Queue ``row``: the row as the sender reads it, and whether it is its queue's head
    (no row of its queue before it is pending), both as of this transaction.

    Where several hosts send, a head is queued leased to this host (its lease starts at the
    insert, on the database's clock), so that the host sends it without a claim of its own:
    :attr:`OutboxItem.held_until` says until when that holds (a third of the lease after
    the job began, leaving its renewal, a third later, inside the lease).  ``reserved``
    (:func:`reserve`, for ``row.queue``): its id and head, the insert's answer not awaited."""
    if reserved is not None and reserved.queue != row.queue:
        raise ValueError(f"outbox id reserved for queue {reserved.queue!r}, not {row.queue!r}")
    payload = dumps(dict(row.payload))
    values = (row.kind, row.queue, row.peer, row.case_key, row.url, payload, now, now)
    held = lease(tx) if dialect(tx).leases else None
    until = 0.0
    if held is None and reserved is not None:
        item_id, head = reserved.read()
        send(tx, _QUEUE_RESERVED, (item_id, *values, deliver_until))
    elif held is None:
        (item_id, head), *_ = tuples(tx, _QUEUE, (*values, deliver_until))
    elif reserved is not None:
        host, seconds, began = held
        item_id, head = reserved.read()
        whole = (item_id, *values, deliver_until, host if head else None, head, seconds)
        send(tx, _queue_reserved(dialect(tx)), whole)
        until = began + seconds / 3 if head else 0.0
    else:
        host, seconds, began = held
        params = (*values, deliver_until, host, seconds, row.queue)
        (item_id, head), *_ = tuples(tx, _queue_leased(dialect(tx)), params)
        until = began + seconds / 3 if head else 0.0
    item = OutboxItem(
        int(item_id),
        row.kind,
        row.queue,
        row.peer,
        row.case_key,
        row.url,
        payload,
        0,
        deliver_until,
        now,
        until,
    )
    return item, bool(head)


_COLUMNS = "kind, queue, peer, case_key, url, payload, created_at, next_attempt_at, deliver_until"
_QUEUE = (
    f"INSERT INTO outbox ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id, "  # noqa: S608 - constant column names
    "NOT EXISTS (SELECT 1 FROM outbox p WHERE p.queue = outbox.queue "
    "AND p.state = 'pending' AND p.id < outbox.id)"
)


_QUEUE_RESERVED = f"INSERT INTO outbox (id, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"  # noqa: S608 - constant column names


@cache
def _queue_leased(d: Dialect) -> str:
    # PostgreSQL's RETURNING and its subqueries see the table as the statement began, not
    # the row it inserts: "no row of its queue pending" before is "none before it" after.
    # The pending row found is locked (FOR SHARE) until this commit: a host recording it
    # sent (:func:`relayed`) waits, then sees this row behind it; one that recorded it
    # first makes this wait, and the row, done by then, is passed over (READ COMMITTED
    # checks a locked row again once its writer committed), so this one is the head.
    return (
        f"INSERT INTO outbox ({_COLUMNS}, claimed_by, claimed_until) "  # noqa: S608 - dialect words only
        "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, CASE WHEN q.head THEN ?::text END, "
        f"CASE WHEN q.head THEN {d.now_epoch} + ?::double precision END FROM (SELECT NOT EXISTS "
        "(SELECT 1 FROM outbox p WHERE p.queue = ? AND p.state = 'pending' FOR SHARE) AS head) q "
        "RETURNING id, claimed_by IS NOT NULL"
    )


@cache
def _queue_reserved(d: Dialect) -> str:
    # A head's lease (claimed_by given) starts at the insert; a row behind one has none.
    return (
        f"INSERT INTO outbox (id, {_COLUMNS}, claimed_by, claimed_until) "  # noqa: S608 - dialect words only
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS TEXT), CASE WHEN CAST(? AS BOOLEAN) "
        f"THEN {d.now_epoch} + CAST(? AS DOUBLE PRECISION) END)"
    )


def abandon_requests(
    tx: Tx, case_key: str, handoff_id: str, at: float | None = None
) -> list[tuple[int, str]]:
    """Withdraw the pending handoff.request of ``handoff_id``: (outbox id, message id) each."""
    found = tuples(tx, _abandon_requests(dialect(tx)), (at, case_key, handoff_id))
    return [(int(oid), str(mid)) for oid, mid in found]


@cache
def _abandon_requests(d: Dialect) -> str:
    return (
        "UPDATE outbox SET state = 'abandoned', done_at = ? WHERE state = 'pending' "  # noqa: S608 - dialect words only
        "AND kind = 'contract' AND case_key = ? "
        f"AND {d.json_get('payload', 'type')} = 'handoff.request' "
        f"AND {d.json_get('payload', 'handoff_id')} = ? RETURNING id, {d.json_get('payload', 'id')}"
    )


@cache
def _heads_of_queues(d: Dialect) -> str:
    return (
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "  # noqa: S608 - dialect words only
        f"o.deliver_until, o.next_attempt_at FROM outbox o{d.hint('INDEXED BY outbox_queue')}"
        f"WHERE o.state = 'pending' AND o.queue IN {d.json_values()} "
        f"AND o.next_attempt_at <= ?{d.unclaimed('o')} "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending')"
    )


@cache
def _heads_of_peers(d: Dialect) -> str:
    return (
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "  # noqa: S608 - dialect words only
        f"o.deliver_until, o.next_attempt_at FROM outbox o{d.hint('NOT INDEXED')}WHERE o.id >= ? "
        f"AND COALESCE(o.peer, '') IN {d.json_values()} "
        f"AND o.queue NOT IN {d.json_values()} "
        f"AND o.state = 'pending' AND o.next_attempt_at <= ?{d.unclaimed('o')} "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.id LIMIT ?"
    )


@cache
def _heads_after(d: Dialect) -> str:
    return (
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "  # noqa: S608 - dialect words only
        "o.deliver_until, o.next_attempt_at, (o.state = 'pending' AND o.next_attempt_at <= ?"
        f"{d.unclaimed('o')} "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending')) "
        "FROM outbox o WHERE o.id > ? ORDER BY o.id LIMIT ?"
    )


@cache
def _heads_fell_due(d: Dialect) -> str:
    return (
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "  # noqa: S608 - dialect words only
        "o.deliver_until, o.next_attempt_at FROM outbox o WHERE o.state = 'pending' "
        "AND o.next_attempt_at >= ? AND NOT (o.next_attempt_at = ? AND o.id <= ?) "
        f"AND o.next_attempt_at <= ?{d.unclaimed('o')} "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at, o.id LIMIT ?"
    )


# The outbox sender finds due queue heads without reading every due row, so a
# backlog for a peer that takes nothing now (hung, failing, full) is not read
# again on each look: new rows by id, rows whose backoff ran out by time, the
# next head of a queue whose send ended, more heads of one peer from an id on
# (masd/edges/outbox_heads.py says when each is asked).  A head is the lowest
# pending id of its queue (docs/protocol.md §10: in order per case and peer).


def _mine(tx: Tx) -> tuple[str, ...]:
    """This host's name for :meth:`~masd.store.backend.Dialect.unclaimed`'s ``?``: a row it
    holds the lease of is its own to send (it queued it as its queue's head)."""
    if not dialect(tx).leases:
        return ()
    held = lease(tx)
    return (held[0] if held else "",)


def heads_after(
    tx: Tx, after_id: int, now: float, limit: int
) -> tuple[list[OutboxItem], int, bool]:
    """Due heads among the ``limit`` rows after ``after_id``; the last id looked at; whether
    the page was full (more rows may follow)."""
    found = tuples(tx, _heads_after(dialect(tx)), (now, *_mine(tx), after_id, limit))
    last = int(found[-1][0]) if found else after_id
    return [OutboxItem(*r[:-1]) for r in found if r[-1]], last, len(found) >= limit


def heads_fell_due(tx: Tx, since: tuple[float, int], now: float, limit: int) -> list[OutboxItem]:
    """Heads due by ``now`` whose (next_attempt_at, id) comes after ``since``, in that order."""
    at, after = since
    found = tuples(tx, _heads_fell_due(dialect(tx)), (at, at, after, now, *_mine(tx), limit))
    return [OutboxItem(*r) for r in found]


def heads_of_queues(tx: Tx, queues: Iterable[str], now: float) -> list[OutboxItem]:
    """The due heads of ``queues``."""
    queues_json = json.dumps(sorted(set(queues)))
    found = tuples(tx, _heads_of_queues(dialect(tx)), (queues_json, now, *_mine(tx)))
    return [OutboxItem(*r) for r in found]


def heads_of_peers(
    tx: Tx, peers: Iterable[str], from_id: int, now: float, busy: Iterable[str], limit: int
) -> list[OutboxItem]:
    """Up to ``limit`` due heads of ``peers`` from ``from_id`` on, by id, none of ``busy``."""
    found = tuples(
        tx,
        _heads_of_peers(dialect(tx)),
        (
            from_id,
            json.dumps(sorted(set(peers))),
            json.dumps(sorted(set(busy))),
            now,
            *_mine(tx),
            limit,
        ),
    )
    return [OutboxItem(*r) for r in found]


def start_id(tx: Tx) -> int:
    """The id after which the sender starts looking: just before the first pending row."""
    found = tuples(
        tx,
        "SELECT (SELECT MIN(id) FROM outbox WHERE state = 'pending'), (SELECT MAX(id) FROM outbox)",
    )
    first, last = found[0] if found else (None, None)
    return int(first) - 1 if first is not None else int(last or 0)


def next_due_at(tx: Tx, now: float) -> float | None:
    """The earliest time after ``now`` at which a pending row falls due, if any."""
    at = value(
        tx,
        "SELECT MIN(next_attempt_at) FROM outbox WHERE state = 'pending' AND next_attempt_at > ?",
        (now,),
    )
    return None if at is None else float(at)


def done(tx: Tx, item_id: int, at: float | None = None) -> None:
    """Delivered (``at``: when, the read side's ``done_at``)."""
    done_many(tx, (item_id,), at)


def relayed(tx: Tx, item_id: int, at: float) -> AfterCommit[tuple[bool, bool]]:
    """The relay took the mail of row ``item_id`` (its ``250``): done at ``at``, its lease
    (where hosts share the store) given back.  The sender runs it as a transaction of its
    own the moment the reply is in, batched with nothing (on PostgreSQL one round trip,
    its answers read with the commit): a host killed after the ``250`` leaves the row
    pending (sent again by another host once its lease lapses, or after a restart) only if
    it died before this commit.  Whether the row was still pending (False: an operator
    dropped it meanwhile), and whether another row of its queue is pending (False: its
    queue has no head to look for, as of this commit).

    On PostgreSQL the second answer is read by a statement of its own, after the update: a
    host queuing a row behind this one locks this row first (:func:`_queue_leased`), so
    either the update waited for that host's commit and the count sees its row, or that
    host waited for this commit and queued its row as its queue's head, its own to send."""
    done = (
        "UPDATE outbox SET state = 'done', attempts = attempts + 1, last_error = NULL, "  # noqa: S608 - dialect words only
        f"done_at = ?{dialect(tx).released()} WHERE id = ? AND state = 'pending' RETURNING id"
    )
    if not dialect(tx).lock_rows:  # one writer (SQLite): nothing is queued meanwhile
        found = tuples(tx, f"{done}, {_BEHIND_IT}", (at, item_id))
        answer = (bool(found), bool(found and found[0][1]))
        return AfterCommit(lambda: answer)
    updated = db(tx).execute(done, (at, item_id))
    behind = db(tx).execute(_BEHIND, (item_id, item_id))
    return AfterCommit(lambda: _relayed(updated.fetchall(), behind.fetchall()))


def _relayed(updated: list[tuple[Any, ...]], behind: list[tuple[Any, ...]]) -> tuple[bool, bool]:
    return bool(updated), bool(updated) and bool(behind[0][0])


#: Another row of the updated row's queue is pending (in its RETURNING clause).
_BEHIND_IT = (
    "EXISTS (SELECT 1 FROM outbox p WHERE p.queue = outbox.queue AND p.state = 'pending' "
    "AND p.id <> outbox.id)"
)
#: The same, as a statement of its own after the update (its own snapshot on PostgreSQL).
_BEHIND = (
    "SELECT EXISTS (SELECT 1 FROM outbox p WHERE p.queue = (SELECT queue FROM outbox "
    "WHERE id = ?) AND p.state = 'pending' AND p.id <> ?)"
)


def done_many(tx: Tx, item_ids: Sequence[int], at: float | None = None) -> None:
    """Several delivered at once (``at``: when, the read side's ``done_at``)."""
    released = dialect(tx).released()
    many(
        tx,
        "UPDATE outbox SET state = 'done', attempts = attempts + 1, last_error = NULL, "  # noqa: S608 - dialect words only
        f"done_at = ?{released} WHERE id = ?",
        [(at, item_id) for item_id in item_ids],
    )


def retry_at(tx: Tx, item_id: int, error: str, next_at: float) -> None:
    send(
        tx,
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? "  # noqa: S608 - dialect words only
        f"{dialect(tx).released()} WHERE id = ?",
        (error, next_at, item_id),
    )


def failed(tx: Tx, item_id: int, detail: str, at: float | None = None) -> None:
    """Given up (``at``: when, the read side's ``done_at``)."""
    send(
        tx,
        "UPDATE outbox SET state = 'failed', attempts = attempts + 1, last_error = ?, "  # noqa: S608 - dialect words only
        f"done_at = ?{dialect(tx).released()} WHERE id = ?",
        (detail, at, item_id),
    )


def claim(tx: Tx, item_ids: Sequence[int], host: str, lease: float) -> list[int]:
    """Take the pending rows ``item_ids`` for ``host`` for ``lease`` seconds; the ids taken.

    Where several hosts send, a row is taken only if no other host holds it (or its
    lease ran out: that host died mid-send, or lost the database) and no concurrent
    transaction has it locked (``SKIP LOCKED``: two hosts claiming at once never wait
    for, nor both get, one row).  A lease is measured on the database's clock, the
    one clock every host shares, and ends with the row's outcome (done, retry,
    failed).  Where one host sends (SQLite), every id is its own already.
    """
    d = dialect(tx)
    if not d.leases:
        return list(item_ids)
    found = tuples(
        tx,
        f"UPDATE outbox SET claimed_by = ?, claimed_until = {d.now_epoch} + ? "  # noqa: S608 - dialect words only
        "WHERE id IN (SELECT id FROM outbox WHERE id = ANY(?) AND state = 'pending' "
        f"AND (claimed_by IS NULL OR claimed_by = ? OR claimed_until < {d.now_epoch}) "
        "FOR UPDATE SKIP LOCKED) RETURNING id",
        (host, lease, list(item_ids), host),
    )
    return sorted(int(r[0]) for r in found)


def renew(tx: Tx, item_id: int, host: str, lease: float) -> bool:
    """Extend ``host``'s lease on the row ``item_id`` it is sending, by ``lease`` seconds
    from now; False when the row is no longer ``host``'s (its lease ran out and another
    host took it, or its outcome is recorded).  Where one host sends: always True."""
    d = dialect(tx)
    if not d.leases:
        return True
    found = tuples(
        tx,
        f"UPDATE outbox SET claimed_until = {d.now_epoch} + ? "  # noqa: S608 - dialect words only
        "WHERE id = ? AND claimed_by = ? AND state = 'pending' RETURNING id",
        (lease, item_id, host),
    )
    return bool(found)


def orphaned_queues(tx: Tx, limit: int = 100) -> list[str]:
    """Queues whose pending head a host took and holds no longer (its lease ran out: that
    host died mid-send, or lost the database), for another host to take over; and queues
    whose head has been due a while and no host took (:data:`UNSEEN_SECONDS`).  Nothing
    where one host sends.

    Where several hosts write at once, outbox ids are taken at insert, not at commit: a
    row whose transaction committed after one holding a later id can fall behind the id
    a sender looked up to (:func:`heads_after`); this finds it."""
    d = dialect(tx)
    if not d.leases:
        return []
    found = tuples(
        tx,
        "SELECT DISTINCT o.queue FROM outbox o WHERE o.state = 'pending' "  # noqa: S608 - dialect words only
        f"AND ((o.claimed_by IS NOT NULL AND o.claimed_until < {d.now_epoch}) "
        f"OR (o.claimed_by IS NULL AND o.next_attempt_at < {d.now_epoch} - ? "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending'))) "
        "LIMIT ?",
        (UNSEEN_SECONDS, limit),
    )
    return sorted(str(r[0]) for r in found)


#: A due queue head no host took for this long is looked at again (:func:`orphaned_queues`).
UNSEEN_SECONDS = 1.0
