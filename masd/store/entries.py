"""The read side's queries across the thread: entries with their delivery, the feed, the case list.

Every thread entry has a ``pos``: its place in commit order across all cases
(:mod:`masd.store.schema`, migration 2).  On SQLite one writer commits whole
batches, so a reader never sees a ``pos`` without every smaller one; on
PostgreSQL the feed's queries read only below the high-water mark
(:meth:`masd.store.backend.Dialect.readable`, masd/store/pg_backend.py) to the
same end: the event feed pages by it, and the case list orders cases by the
``pos`` of their latest entry.

A ``case.erased`` entry is all that is left of an erased case
(:func:`masd.store.retention.erase_case`): its case's row is gone, so the
entries are read with a ``LEFT JOIN`` on ``cases`` and the address from the
entry's data.

A ``mail.out`` or ``contract.out`` entry names its outbox row
(``outbox_id`` in its data); its delivery is read from that row, or from
``outbox_sent`` once housekeeping has deleted the delivered row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from masd.store.backend import Dialect
from masd.store.sql import Tx, dialect, tuples, value


@dataclass(frozen=True)
class Delivery:
    """What the store knows of one entry's outbox row.

    ``state`` is the row's (``pending``, ``done``, ``failed``, ``abandoned``),
    ``kept`` when only ``outbox_sent`` remembers it (delivered, then purged),
    ``unknown`` when the entry names no row (none was found for an entry
    written before rows were named).
    """

    state: str
    attempts: int | None = None
    last_error: str | None = None
    next_attempt_at: float | None = None
    done_at: float | None = None
    #: a mail's permanent bounce: (status, diagnostic, remote MTA), else None
    bounce: tuple[str, str | None, str | None] | None = None


@dataclass(frozen=True)
class EntryRow:
    """One thread entry as stored, with its case's address and its row's delivery."""

    pos: int
    case_key: str
    address: str
    seq: int
    kind: str
    at: float
    data: str
    delivery: Delivery | None


@cache
def _entries(d: Dialect) -> str:
    outbox_id = d.json_int("t.data", "outbox_id")
    # A case.erased entry outlives its case: the address is in its data.
    address = f"COALESCE(c.address, {d.json_get('t.data', 'address')})"
    return (
        f"SELECT t.pos, t.case_key, {address}, t.seq, t.kind, t.at, t.data, "  # noqa: S608 - dialect words only
        "o.state, o.attempts, o.last_error, o.next_attempt_at, o.done_at, "
        "s.attempts, s.done_at, b.status, b.diagnostic, b.remote_mta "
        "FROM thread t LEFT JOIN cases c ON c.key = t.case_key "
        "LEFT JOIN outbox o ON t.kind IN ('mail.out', 'contract.out') "
        f"AND o.id = {outbox_id} "
        "LEFT JOIN outbox_sent s ON t.kind IN ('mail.out', 'contract.out') "
        f"AND s.id = {outbox_id} "
        "LEFT JOIN bounces b ON t.kind = 'mail.out' AND b.message_ref = "
        "(SELECT MIN(x.message_ref) FROM bounces x "
        f"WHERE x.outbox_id = {outbox_id} AND x.permanent = 1) "
    )


def _entry(row: tuple[Any, ...]) -> EntryRow:
    pos, key, address, seq, kind, at, data = row[:7]
    state, attempts, error, next_at, done_at, kept_attempts, kept_done_at = row[7:14]
    bounce = None if row[14] is None else (str(row[14]), row[15], row[16])
    delivery: Delivery | None = None
    if kind in ("mail.out", "contract.out"):
        if state is not None:
            delivery = Delivery(str(state), int(attempts), error, next_at, done_at, bounce)
        elif kept_attempts is not None:
            delivery = Delivery("kept", int(kept_attempts), None, None, kept_done_at, bounce)
        else:
            delivery = Delivery("unknown", bounce=bounce)
    return EntryRow(
        int(pos), str(key), str(address), int(seq), str(kind), float(at), str(data), delivery
    )


def case_entries(tx: Tx, key: str, after: int, limit: int) -> list[EntryRow]:
    """The entries of case ``key`` with ``seq > after``, in order, at most ``limit``."""
    found = tuples(
        tx,
        _entries(dialect(tx)) + "WHERE t.case_key = ? AND t.seq > ? ORDER BY t.seq LIMIT ?",
        (key, after, limit),
    )
    return [_entry(r) for r in found]


def events(tx: Tx, after: int, limit: int, case_key: str | None = None) -> list[EntryRow]:
    """The entries with ``pos > after`` (of case ``case_key`` only, if given), in commit
    order, below the feed's high-water mark (:meth:`Dialect.readable`)."""
    d = dialect(tx)
    if case_key is None:
        found = tuples(
            tx,
            _entries(d) + f"WHERE t.pos > ?{d.readable('t')} ORDER BY t.pos LIMIT ?",
            (after, limit),
        )
    else:
        found = tuples(
            tx,
            _entries(d)
            + f"WHERE t.case_key = ? AND t.pos > ?{d.readable('t')} ORDER BY t.pos LIMIT ?",
            (case_key, after, limit),
        )
    return [_entry(r) for r in found]


def last_events(tx: Tx, count: int, case_key: str | None = None) -> list[EntryRow]:
    """The latest ``count`` entries (of case ``case_key`` only, if given), in commit order."""
    d = dialect(tx)
    where, params = (
        ("", (count,)) if case_key is None else ("AND t.case_key = ? ", (case_key, count))
    )
    found = tuples(
        tx,
        _entries(d) + f"WHERE TRUE{d.readable('t')} " + where + "ORDER BY t.pos DESC LIMIT ?",
        params,
    )
    return [_entry(r) for r in reversed(found)]


def last_pos(tx: Tx) -> int:
    """The ``pos`` of the latest entry committed below the high-water mark (0: none yet)."""
    d = dialect(tx)
    latest = f"SELECT COALESCE(MAX(pos), 0) FROM thread t WHERE TRUE{d.readable('t')}"  # noqa: S608
    return int(value(tx, latest))


@cache
def _list_cases(d: Dialect, scoped: bool = False) -> str:
    """The case list's query; ``scoped``: one more parameter before the limit, a JSON
    array of ``"domain/type"`` pairs the cases must be of."""
    h = d.row_order("handoff_id")
    scope = f"AND c.domain || '/' || c.type IN {d.json_values()} " if scoped else ""
    return (
        "SELECT c.key, c.address, c.domain, c.type, c.role, c.participant, c.created_at, "  # noqa: S608 - dialect words only
        "t.pos, t.at, h.handoff_id, h.mode, h.status "
        "FROM thread t CROSS JOIN cases c "
        f"LEFT JOIN handoffs h ON h.{h} = (SELECT {h} FROM handoffs WHERE case_key = c.key "
        f"AND closed_at IS NULL ORDER BY requested_at DESC, {h} DESC LIMIT 1) "
        "WHERE c.key = t.case_key AND c.thread_seq = t.seq AND t.pos < ? "
        f"AND ({d.param('BOOLEAN')} IS NULL OR ? = (h.handoff_id IS NOT NULL)) "
        f"AND ({d.param('TEXT')} IS NULL OR {d.nocase('c.participant')}) "
        f"AND ({d.param('TEXT')} IS NULL OR c.domain = ?) {scope}"
        "ORDER BY t.pos DESC LIMIT ?"
    )


@dataclass(frozen=True)
class ListedCase:
    """A case as the case list shows it, with its latest entry and its open handoff."""

    key: str
    address: str
    domain: str
    type: str
    role: str
    participant: str | None
    created_at: float
    last_pos: int
    last_at: float
    open_handoff: tuple[str, str, str] | None  # (handoff_id, mode, status)


def cases(
    tx: Tx,
    *,
    before: int | None,
    limit: int,
    open_handoff: bool | None = None,
    participant: str | None = None,
    domain: str | None = None,
) -> list[ListedCase]:
    """Cases by latest activity, newest first: those whose latest entry has a
    ``pos`` below ``before`` (all when None), at most ``limit``.

    ``open_handoff``: only cases with (True) or without (False) a handoff not
    closed; ``participant`` compared without regard to case; ``domain`` exact.
    The thread is walked down from ``before``, one case per latest entry, so
    a page costs the entries above it, not the number of cases.
    """
    found = tuples(
        tx,
        _list_cases(dialect(tx)),
        (
            2**63 - 1 if before is None else before,
            open_handoff,
            open_handoff,
            participant,
            participant,
            domain,
            domain,
            limit,
        ),
    )
    return [listed_case(r) for r in found]


def listed_case(r: tuple[Any, ...]) -> ListedCase:
    """A row of :func:`_list_cases` as a :class:`ListedCase`."""
    return ListedCase(
        key=str(r[0]),
        address=str(r[1]),
        domain=str(r[2]),
        type=str(r[3]),
        role=str(r[4]),
        participant=r[5],
        created_at=float(r[6]),
        last_pos=int(r[7]),
        last_at=float(r[8]),
        open_handoff=None if r[9] is None else (str(r[9]), str(r[10]), str(r[11])),
    )


def keys_with_id(tx: Tx, case_id: str) -> list[str]:
    """The keys of every case whose id is ``case_id`` (compared casefolded, as keys are)."""
    found = tuples(
        tx,
        "SELECT key FROM cases WHERE key LIKE ? ESCAPE '\\' ORDER BY key",
        ("%=" + _like(case_id.casefold()) + "@%",),
    )
    return [str(k) for (k,) in found]


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
