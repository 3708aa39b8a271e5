"""The read side: cases, their handoffs and threads as JSON (docs/protocol.md §16).

Every function taking a store handle runs inside one store read job
(``await store.read(lambda tx: case_json(tx, key))``), so what it returns is
one consistent snapshot; the rows come from :mod:`masd.store.reads` and
:mod:`masd.store.entries`.  The JSON documents are exactly the bodies of
``GET /mas/v0.1/cases/{key}``, ``GET /mas/v0.1/cases/{key}/thread`` and
``GET /mas/v0.1/cases``; :mod:`masd.cli.text` renders the same for an
operator (``masd case show``, ``masd case list``).  The event feed is
:mod:`masd.read.feed`.

Times: the store keeps epoch seconds; here they become RFC 3339 UTC strings
with ``Z`` (second precision, :func:`masd.core.times.rfc3339`; the per-case
``seq`` orders entries).

Thread entries are flat: ``{"seq", "kind", "at", ...data}``.  A data field
whose name is one of ``seq``, ``kind`` or ``at`` is prefixed with the
entry kind's first word: a status entry's own ``seq`` and ``at`` (from the
mode's ``handoff.status``) become ``status_seq`` and ``status_at``, a failed
delivery's outbox ``kind`` becomes ``delivery_kind``.  A ``mail.out`` or
``contract.out`` entry also carries ``delivery``, read from its outbox row
when the entry is read (:func:`delivery_json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from masd.core.address import case_ref
from masd.core.errors import AddressError
from masd.core.times import rfc3339
from masd.store import Tx, cases, reads
from masd.store.entries import Delivery, EntryRow, ListedCase, case_entries, keys_with_id
from masd.store.entries import cases as case_rows
from masd.store.message_reads import scoped_cases

#: ``limit`` of a thread page: default and largest (docs/protocol.md §16 read side).
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
#: ``limit`` of a page of the case list: default (the largest is MAX_LIMIT).
DEFAULT_CASES: Final = 50
#: ``state`` of the case list: cases with a handoff not closed, or without.
CASE_STATES: Final = ("open", "closed")
#: A case list cursor: this prefix, then the ``pos`` of the last case's latest entry.
_CASE_CURSOR: Final = "c"

_ENTRY_KEYS: Final = ("seq", "kind", "at")


def normalize_key(text: str) -> str:
    """The equivalence key of a case address or key in any spelling.

    ``ticket=GS-1@Help.Example`` and ``ticket=gs-1@help.example`` name the
    same case (docs/protocol.md §2).  Text that is not a resource address is returned
    unchanged, so the lookup simply finds nothing.
    """
    try:
        return case_ref(text)["key"]
    except (AddressError, ValueError):
        return text


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _handoff_json(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "handoff_id": row["handoff_id"],
        "mode": row["mode"],
        "status": row["status"],
        "seq": row["last_seq"],
        "peer": row["peer"],
        "requested_at": rfc3339(row["requested_at"]),
        "deadline_at": rfc3339(row["deadline_at"]),
        "closed_at": rfc3339(row["closed_at"]),
        "forwarded": bool(row["forwarded"]),
        "webhook_url": row["webhook_url"],
        "details": _loads(row["details"]) or {},
    }


def case_json(tx: Tx, key: str) -> dict[str, Any] | None:
    """``{"case": {...}}`` for the case whose address or key is ``key``; None if none."""
    row = reads.case(tx, normalize_key(key))
    if row is None:
        return None
    handoffs = reads.handoffs(tx, row["key"])
    return {
        "case": {
            "address": row["address"],
            "key": row["key"],
            "domain": row["domain"],
            "type": row["type"],
            "id": row["id"],
            "role": row["role"],
            "participant": row["participant"],
            "created_at": rfc3339(row["created_at"]),
            "policy": _loads(row["policy"]),
            "entries": row["thread_seq"],
            "sent": row["sent_count"],
            "handoffs": [_handoff_json(h) for h in handoffs],
        }
    }


def entry_json(
    seq: int, kind: str, at: float, data: Mapping[str, Any], delivery: Delivery | None = None
) -> dict[str, Any]:
    """One thread entry, flat; colliding data fields get the kind's first word as prefix."""
    out: dict[str, Any] = {"seq": seq, "kind": kind, "at": rfc3339(at)}
    prefix = kind.split(".")[0]
    for name, value in data.items():
        out[f"{prefix}_{name}" if name in _ENTRY_KEYS else name] = value
    if delivery is not None:
        out["delivery"] = delivery_json(delivery)
    return out


def row_json(row: EntryRow) -> dict[str, Any]:
    """:func:`entry_json` of a stored entry.

    A ``case.erased`` entry's data holds its case's address, which the event
    already names (``case``): the entry itself is its ``seq``, ``kind`` and ``at``.
    """
    data = {} if row.kind == "case.erased" else json.loads(row.data)
    return entry_json(row.seq, row.kind, row.at, data, row.delivery)


#: What the read side says of a row withdrawn without an error of its own.
WITHDRAWN: Final = "withdrawn before it went out (its handoff's deadline passed)"


def delivery_json(d: Delivery) -> dict[str, Any]:
    """docs/protocol.md §16 delivery state of an outbox row (docs/protocol.md §16.3).

    A pending row is ``queued`` until its first try, then ``retrying``; a
    delivered one ``sent`` (also once housekeeping removed it); one given up,
    withdrawn at a deadline or dropped by the operator ``failed``; a mail a
    permanent bounce reported ``bounced``, with its status (docs/protocol.md §22).
    """
    if d.bounce is not None:
        status, diagnostic, remote_mta = d.bounce
        out = _delivery("bounced", d.attempts, d.last_error, None, d.done_at)
        out.update(status=status, diagnostic=diagnostic, remote_mta=remote_mta)
        return out
    if d.state == "pending":
        state = "queued" if not d.attempts else "retrying"
        return _delivery(state, d.attempts, d.last_error, d.next_attempt_at, None)
    if d.state in ("done", "kept", "unknown"):
        return _delivery("sent", d.attempts, None, None, d.done_at)
    error = d.last_error or (WITHDRAWN if d.state == "abandoned" else None)
    return _delivery("failed", d.attempts, error, None, d.done_at)


def _delivery(
    state: str, attempts: int | None, error: str | None, next_at: float | None, done: float | None
) -> dict[str, Any]:
    return {
        "state": state,
        "attempts": attempts,
        "last_error": error,
        "next_attempt_at": rfc3339(next_at),
        "done_at": rfc3339(done),
    }


def thread_json(
    tx: Tx, key: str, after: int = 0, limit: int = DEFAULT_LIMIT
) -> dict[str, Any] | None:
    """``{"entries": [...], "next": N}``: entries with ``seq > after``, at most
    ``limit`` (at least 1), in ``seq`` order; None if no such case.  The HTTP
    edge bounds ``limit`` by :data:`MAX_LIMIT`; an operator's CLI may ask for more.

    ``next`` is the ``after`` of the following page: the last ``seq`` returned,
    or ``after`` itself when the page is empty.
    """
    norm = normalize_key(key)
    if not cases.exists(tx, norm):
        return None
    rows = case_entries(tx, norm, max(0, after), max(1, limit))
    entries = [row_json(r) for r in rows]
    return {"entries": entries, "next": entries[-1]["seq"] if entries else max(0, after)}


def keys_named(tx: Tx, text: str) -> list[str]:
    """The keys of the cases ``text`` names: an address or key in any spelling
    (one case or none), or a bare case id such as ``gs-1`` (one case per
    domain and type that has it)."""
    if "@" in text:
        key = normalize_key(text)
        return [key] if cases.exists(tx, key) else []
    return keys_with_id(tx, text)


# --------------------------------------------------------------------------- the case list


@dataclass(frozen=True)
class CaseFilter:
    """The filters of the case list (``GET /mas/v0.1/cases``, ``masd case list``).

    ``state``: ``open`` (a handoff not closed yet: a mode is at work) or
    ``closed`` (none); ``participant``: an address, any case; ``domain``.
    """

    state: str | None = None
    participant: str | None = None
    domain: str | None = None


#: The largest ``pos`` the store can hold (SQLite's INTEGER, 64 bits signed).
MAX_POS: Final = 2**63 - 1


def case_cursor(pos: int) -> str:
    return f"{_CASE_CURSOR}{pos}"


def parse_case_cursor(text: str) -> int | None:
    """The ``pos`` in a case list cursor, or None when ``text`` is not one."""
    digits = text[len(_CASE_CURSOR) :]
    ok = text.startswith(_CASE_CURSOR) and digits.isascii() and digits.isdigit()
    # The length first (no conversion of thousands of digits), then the store's range.
    pos = int(digits) if ok and len(digits) <= 19 else None
    return pos if pos is not None and pos <= MAX_POS else None


def _case_item(r: ListedCase) -> dict[str, Any]:
    handoff = r.open_handoff
    return {
        "address": r.address,
        "key": r.key,
        "domain": r.domain,
        "type": r.type,
        "role": r.role,
        "participant": r.participant,
        "opened_at": rfc3339(r.created_at),
        "last_activity_at": rfc3339(r.last_at),
        "open_handoff": None
        if handoff is None
        else {"handoff_id": handoff[0], "mode": handoff[1], "status": handoff[2]},
    }


def cases_json(
    tx: Tx,
    after: int | None = None,
    limit: int = DEFAULT_CASES,
    where: CaseFilter = CaseFilter(),
    scope: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``{"cases": [...], "next": cursor or null}``: the cases after the cursor
    ``after`` (a parsed ``pos``; None: from the newest), latest activity first.

    ``next`` is null once no case follows.  A case whose activity moves it
    above the cursor while a client pages is not shown again on a later page.
    ``scope``: only the cases of these ``"domain/type"`` pairs (a master's own).
    """
    filters: dict[str, Any] = {
        "before": after,
        "limit": max(1, limit) + 1,
        "open_handoff": None if where.state is None else where.state == "open",
        "participant": where.participant,
        "domain": where.domain.lower() if where.domain else None,
    }
    rows = case_rows(tx, **filters) if scope is None else scoped_cases(tx, **filters, scope=scope)
    page = rows[: max(1, limit)]
    more = len(rows) > len(page)
    return {
        "cases": [_case_item(r) for r in page],
        "next": case_cursor(page[-1].last_pos) if more else None,
    }


def open_work(tx: Tx) -> dict[str, list[dict[str, Any]]]:
    """What masd has not finished yet, across every case.

    ``{"handoffs": [...], "outbox": [...]}``: each handoff not closed
    (``handoff_id``, ``case_key``, the case's ``role``, ``mode``, ``status``),
    oldest first, and each outbox row still to be delivered (``id``,
    ``kind``, ``case_key``, ``peer``, ``attempts``, ``last_error``), in queue
    order.  Both lists empty: every flow has settled.
    """
    return {"handoffs": reads.open_handoffs(tx), "outbox": reads.pending_outbox(tx)}
