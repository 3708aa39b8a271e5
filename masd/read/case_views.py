"""The read side: cases, their handoffs and threads as JSON and as text (docs/protocol.md §16).

Every function taking a store handle runs inside one store read job
(``await store.read(lambda tx: case_json(tx, key))``), so what it returns is
one consistent snapshot; the rows come from :mod:`masd.store.reads` and
:mod:`masd.store.entries`.  The JSON documents are exactly the bodies of
``GET /mas/v0.1/cases/{key}``, ``GET /mas/v0.1/cases/{key}/thread`` and
``GET /mas/v0.1/cases``; :func:`format_case` and :func:`format_cases` render
the same for an operator (``masd case show``, ``masd case list``).  The event
feed is :mod:`masd.read.feed`.

Times: the store keeps epoch seconds; here they become RFC 3339 UTC strings
with ``Z`` (second precision; the per-case ``seq`` orders entries).

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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from masd.core.address import case_ref
from masd.core.errors import AddressError
from masd.store import Tx, cases, reads
from masd.store.entries import Delivery, EntryRow, ListedCase, case_entries, keys_with_id
from masd.store.entries import cases as case_rows

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


def rfc3339(ts: float | None) -> str | None:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SSZ`` (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    """:func:`entry_json` of a stored entry."""
    return entry_json(row.seq, row.kind, row.at, json.loads(row.data), row.delivery)


#: What the read side says of a row withdrawn without an error of its own.
WITHDRAWN: Final = "withdrawn before it went out (its handoff's deadline passed)"


def delivery_json(d: Delivery) -> dict[str, Any]:
    """docs/protocol.md §16 delivery state of an outbox row (docs/protocol.md §16.3).

    A pending row is ``queued`` until its first try, then ``retrying``; a
    delivered one ``sent`` (also once housekeeping removed it); one given up,
    withdrawn at a deadline or dropped by the operator ``failed``.
    """
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


def case_cursor(pos: int) -> str:
    return f"{_CASE_CURSOR}{pos}"


def parse_case_cursor(text: str) -> int | None:
    """The ``pos`` in a case list cursor, or None when ``text`` is not one."""
    digits = text[len(_CASE_CURSOR) :]
    ok = text.startswith(_CASE_CURSOR) and digits.isascii() and digits.isdigit()
    return int(digits) if ok and len(digits) <= 19 else None


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
    tx: Tx, after: int | None = None, limit: int = DEFAULT_CASES, where: CaseFilter = CaseFilter()
) -> dict[str, Any]:
    """``{"cases": [...], "next": cursor or null}``: the cases after the cursor
    ``after`` (a parsed ``pos``; None: from the newest), latest activity first.

    ``next`` is null once no case follows.  A case whose activity moves it
    above the cursor while a client pages is not shown again on a later page.
    """
    rows = case_rows(
        tx,
        before=after,
        limit=max(1, limit) + 1,
        open_handoff=None if where.state is None else where.state == "open",
        participant=where.participant,
        domain=where.domain.lower() if where.domain else None,
    )
    page = rows[: max(1, limit)]
    more = len(rows) > len(page)
    return {
        "cases": [_case_item(r) for r in page],
        "next": case_cursor(page[-1].last_pos) if more else None,
    }


def list_cases(
    tx: Tx, limit: int = DEFAULT_LIMIT, domain: str | None = None
) -> list[dict[str, Any]]:
    """The cases most recently opened first, each with its latest handoff (or None).

    (The case list of the API and ``masd case list`` is :func:`cases_json`,
    by latest activity.)
    """
    rows = reads.latest_cases(tx, max(1, limit), domain.lower() if domain else None)
    return [
        {
            "key": r["key"],
            "address": r["address"],
            "domain": r["domain"],
            "type": r["type"],
            "role": r["role"],
            "participant": r["participant"],
            "created_at": rfc3339(r["created_at"]),
            "entries": r["thread_seq"],
            "handoff": None
            if r["handoff_id"] is None
            else {"handoff_id": r["handoff_id"], "mode": r["mode"], "status": r["status"]},
        }
        for r in rows
    ]


def open_work(tx: Tx) -> dict[str, list[dict[str, Any]]]:
    """What masd has not finished yet, across every case.

    ``{"handoffs": [...], "outbox": [...]}``: each handoff not closed
    (``handoff_id``, ``case_key``, the case's ``role``, ``mode``, ``status``),
    oldest first, and each outbox row still to be delivered (``id``,
    ``kind``, ``case_key``, ``peer``, ``attempts``, ``last_error``), in queue
    order.  Both lists empty: every flow has settled.
    """
    return {"handoffs": reads.open_handoffs(tx), "outbox": reads.pending_outbox(tx)}


# --------------------------------------------------------------------------- text for operators

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _clean(value: object, limit: int = 200) -> str:
    """One line, control characters shown as ``\\xNN``, cut at ``limit``."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _q(value: object, limit: int = 200) -> str:
    return '"' + _clean(value, limit).replace('"', '\\"') + '"'


def _short(handoff_id: object) -> str:
    return str(handoff_id)[:8]


def _pairs(entry: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        value = entry.get(name)
        if value is None or value == "" or value == []:
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        out.append(f"{name}={_q(value) if name == 'detail' else _clean(value)}")
    return out


def _essentials(e: Mapping[str, Any]) -> list[str]:
    kind = e.get("kind")
    if kind == "mail.in":
        parts = [f"from {_clean(e.get('from') or '(no From)')}", _q(e.get("subject") or "")]
        parts.append(f"dmarc={_clean(e.get('dmarc'))}")
        if e.get("automated"):
            parts.append("automated")
        if e.get("requested_mode"):
            parts.append(f"!{_clean(e['requested_mode'])}")
        return parts
    if kind == "mail.out":
        return [
            f"to {_clean(e.get('to'))}",
            _q(e.get("subject") or ""),
            f"({_clean(e.get('purpose'))})",
            _clean(e.get("message_id") or ""),
        ]
    if kind == "mail.refused":
        parts = [f"reason={_clean(e.get('reason'))}", f"({_clean(e.get('purpose'))})"]
        if e.get("to"):
            parts.insert(1, f"to {_clean(e['to'])}")
        return parts
    if kind == "status":
        parts = [
            f"{_clean(e.get('mode'))} {_short(e.get('handoff_id'))}",
            _clean(e.get("status")),
            f"by {_clean(e.get('source'))}",
        ]
        if e.get("status_seq") is not None:
            parts.append(f"seq={e['status_seq']}")
        return parts + _pairs(e, ("reason", "needs", "status_at", "outcome", "detail"))
    if kind in ("contract.in", "contract.out"):
        arrow = "from" if kind == "contract.in" else "to"
        parts = [_clean(e.get("type")), f"id={_clean(e.get('id'))}"]
        if e.get("peer"):
            parts.append(f"{arrow} {_clean(e['peer'])}")
        if e.get("handoff_id"):
            parts.append(f"handoff {_short(e['handoff_id'])}")
        return parts
    if kind == "delivery.failed":
        parts = [_clean(e.get("type") or e.get("delivery_kind") or "")]
        if e.get("id"):
            parts.append(f"id={_clean(e['id'])}")
        if e.get("to"):
            parts.append(f"to {_clean(e['to'])}")
        return [*parts, _q(e.get("detail") or "")]
    skip = {"seq", "kind", "at"}
    return [f"{k}={_clean(v)}" for k, v in e.items() if k not in skip]


def format_delivery(d: Mapping[str, Any]) -> str:
    """``[sent, 1 attempt, 2026-...Z]``, ``[retrying, 3 attempts, next 2026-...Z: error]``."""
    parts = [_clean(d.get("state"))]
    attempts = d.get("attempts")
    if attempts is not None:
        parts.append(f"{attempts} attempt{'' if attempts == 1 else 's'}")
    if d.get("next_attempt_at"):
        parts.append(f"next {d['next_attempt_at']}")
    if d.get("done_at"):
        parts.append(str(d["done_at"]))
    text = ", ".join(parts)
    if d.get("last_error"):
        text += f": {_q(d['last_error'], 120)}"
    return f"[{text}]"


def format_entry(entry: Mapping[str, Any]) -> str:
    """``2026-11-29T19:50:01Z  mail.in      from alice@example.com "Subject" ...``"""
    parts = [p for p in _essentials(entry) if p]
    delivery = entry.get("delivery")
    if isinstance(delivery, Mapping):
        parts.append(format_delivery(delivery))
    return f"{entry.get('at')}  {_clean(entry.get('kind')):<15} {'  '.join(parts)}".rstrip()


def format_event(event: Mapping[str, Any]) -> str:
    """``masd tail``: ``2026-11-29T19:50:01Z  ticket=gs-1@help.example  mail.in  from ...``"""
    entry = event.get("entry") or {}
    line = format_entry(entry)
    at = str(entry.get("at"))
    key = _clean((event.get("case") or {}).get("key"), 100)
    return f"{at}  {key}  {line[len(at) + 2 :]}" if line.startswith(at) else f"{key}  {line}"


#: The columns of ``masd case list``: header and how each row fills it.
_CASE_COLUMNS: Final = ("KEY", "ROLE", "PARTICIPANT", "OPENED", "LAST ACTIVITY", "OPEN HANDOFF")


def format_cases(doc: Mapping[str, Any]) -> str:
    """``masd case list``: a header row, then one row per case of :func:`cases_json`."""
    rows = [list(_CASE_COLUMNS)]
    for c in doc.get("cases") or []:
        h = c.get("open_handoff")
        rows.append(
            [
                _clean(c.get("key"), 100),
                _clean(c.get("role")),
                _clean(c.get("participant") or "-", 100),
                str(c.get("opened_at")),
                str(c.get("last_activity_at")),
                f"{_clean(h['mode'])}:{_clean(h['status'])}" if h else "-",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_CASE_COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def format_case(case: Mapping[str, Any], thread: Mapping[str, Any] | None = None) -> str:
    """A readable page for an operator: the case, its handoffs, then one line per entry.

    ``case`` is :func:`case_json`'s document (or its inner ``"case"``),
    ``thread`` :func:`thread_json`'s (entries shown in the order given).
    """
    c = case.get("case", case)
    lines = [
        f"case {c['address']}  ({c['role']} role, key {c['key']})",
        f"  participant {c.get('participant') or '(none)'}, opened {c.get('created_at')}",
    ]
    if c.get("policy"):
        lines.append(f"  policy {json.dumps(c['policy'], sort_keys=True)}")
    handoffs = c.get("handoffs") or []
    lines.append(f"handoffs ({len(handoffs)}):")
    for h in handoffs:
        closed = f", closed {h['closed_at']}" if h.get("closed_at") else ""
        deadline = f", deadline {h['deadline_at']}" if h.get("deadline_at") else ""
        seq = f" seq {h['seq']}" if h.get("seq") is not None else ""
        lines.append(
            f"  {h['handoff_id']}  {h['mode']}  {h['status']}{seq}"
            f"  (requested {h.get('requested_at')}{deadline}{closed})"
        )
    entries = (thread or {}).get("entries") or []
    lines.append(f"thread ({len(entries)} entries):")
    lines.extend(format_entry(e) for e in entries)
    return "\n".join(lines) + "\n"
