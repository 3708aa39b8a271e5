"""The read side: a case, its handoffs and its thread as JSON and as text (PROFILE §11).

Every function taking a database runs inside one store read job
(``await store.read(lambda db: case_json(db, key))``), so what it returns is
one consistent snapshot.  The JSON documents are exactly the bodies of
``GET /mas/v0.1/cases/{key}`` and ``GET /mas/v0.1/cases/{key}/thread``;
:func:`format_case` renders the same for an operator (``masd case show``).

Times: the store keeps epoch seconds; here they become RFC 3339 UTC strings
with ``Z`` (second precision; the per-case ``seq`` orders entries).

Thread entries are flat: ``{"seq", "kind", "at", ...data}``.  A data field
whose name is one of ``seq``, ``kind`` or ``at`` is prefixed with the
entry kind's first word: a status entry's own ``seq`` and ``at`` (from the
mode's ``handoff.status``) become ``status_seq`` and ``status_at``, a failed
delivery's outbox ``kind`` becomes ``delivery_kind``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from sqlite_utils import Database

from masd.core.address import case_ref
from masd.core.errors import AddressError

#: ``limit`` of a thread page: default and largest (PROFILE §11 read side).
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000

_ENTRY_KEYS: Final = ("seq", "kind", "at")


def rfc3339(ts: float | None) -> str | None:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SSZ`` (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_key(text: str) -> str:
    """The equivalence key of a case address or key in any spelling.

    ``ticket=GS-1@Help.Example`` and ``ticket=gs-1@help.example`` name the
    same case (PROFILE §1).  Text that is not a resource address is returned
    unchanged, so the lookup simply finds nothing.
    """
    try:
        return case_ref(text)["key"]
    except (AddressError, ValueError):
        return text


def _rows(db: Database, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur = db.execute(sql, tuple(params))
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


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


def case_json(db: Database, key: str) -> dict[str, Any] | None:
    """``{"case": {...}}`` for the case whose address or key is ``key``; None if none."""
    found = _rows(db, "SELECT * FROM cases WHERE key = ?", (normalize_key(key),))
    if not found:
        return None
    row = found[0]
    handoffs = _rows(
        db,
        "SELECT * FROM handoffs WHERE case_key = ? ORDER BY requested_at, rowid",
        (row["key"],),
    )
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


def entry_json(seq: int, kind: str, at: float, data: Mapping[str, Any]) -> dict[str, Any]:
    """One thread entry, flat; colliding data fields get the kind's first word as prefix."""
    out: dict[str, Any] = {"seq": seq, "kind": kind, "at": rfc3339(at)}
    prefix = kind.split(".")[0]
    for name, value in data.items():
        out[f"{prefix}_{name}" if name in _ENTRY_KEYS else name] = value
    return out


def thread_json(
    db: Database, key: str, after: int = 0, limit: int = DEFAULT_LIMIT
) -> dict[str, Any] | None:
    """``{"entries": [...], "next": N}``: entries with ``seq > after``, at most
    ``limit`` (at least 1), in ``seq`` order; None if no such case.  The HTTP
    edge bounds ``limit`` by :data:`MAX_LIMIT`; an operator's CLI may ask for more.

    ``next`` is the ``after`` of the following page: the last ``seq`` returned,
    or ``after`` itself when the page is empty.
    """
    norm = normalize_key(key)
    if not _rows(db, "SELECT 1 AS x FROM cases WHERE key = ?", (norm,)):
        return None
    limit = max(1, limit)
    rows = db.execute(
        "SELECT seq, kind, at, data FROM thread WHERE case_key = ? AND seq > ? "
        "ORDER BY seq LIMIT ?",
        (norm, max(0, after), limit),
    ).fetchall()
    entries = [entry_json(seq, kind, at, json.loads(data)) for seq, kind, at, data in rows]
    return {"entries": entries, "next": entries[-1]["seq"] if entries else max(0, after)}


def list_cases(
    db: Database, limit: int = DEFAULT_LIMIT, domain: str | None = None
) -> list[dict[str, Any]]:
    """The newest cases first, each with its latest handoff (or None)."""
    rows = _rows(
        db,
        "SELECT c.key, c.address, c.domain, c.type, c.role, c.participant, c.created_at, "
        "c.thread_seq, h.handoff_id, h.mode, h.status FROM cases c "
        "LEFT JOIN handoffs h ON h.rowid = (SELECT rowid FROM handoffs WHERE case_key = c.key "
        "ORDER BY requested_at DESC, rowid DESC LIMIT 1) "
        "WHERE ?1 IS NULL OR c.domain = ?1 ORDER BY c.created_at DESC, c.rowid DESC LIMIT ?2",
        (domain.lower() if domain else None, max(1, limit)),
    )
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


def pending_deliveries(db: Database) -> list[dict[str, Any]]:
    """Outbox rows still to be delivered, oldest first: ``id``, ``kind`` (contract or
    mail), ``peer``, ``case_key``, ``attempts``, ``last_error``.  Empty when masd has
    nothing left to send."""
    return _rows(
        db,
        "SELECT id, kind, peer, case_key, attempts, last_error FROM outbox "
        "WHERE state = 'pending' ORDER BY id",
        (),
    )


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


def format_entry(entry: Mapping[str, Any]) -> str:
    """``2026-11-29T19:50:01Z  mail.in      from alice@example.com "Subject" ...``"""
    parts = [p for p in _essentials(entry) if p]
    return f"{entry.get('at')}  {_clean(entry.get('kind')):<15} {'  '.join(parts)}".rstrip()


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
