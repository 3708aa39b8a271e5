"""What the ``masd`` commands print for an operator: one line per entry, event or item.

Each function renders a JSON document of the read side as text: a case and
its thread (``masd case show``, :func:`format_case`), the case list
(``masd case list``, :func:`format_cases`), events (``masd tail``,
:func:`format_event`) and the outbound queue (``masd queue``,
:func:`format_items`).  The documents are those of :mod:`masd.read.case_views`,
:mod:`masd.read.feed` and :mod:`masd.read.queue_items`, the same that HTTP
serves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

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
    if kind == "mail.bounced":
        parts = [f"to {_clean(e.get('recipient'))}", _clean(e.get("status"))]
        parts.append("permanent" if e.get("permanent") else "delayed")
        if e.get("mail_seq") is not None:
            parts.append(f"mail_seq={e['mail_seq']}")
        diagnostic = [_q(e["diagnostic"])] if e.get("diagnostic") else []
        return parts + _pairs(e, ("remote_mta", "claimed_recipient")) + diagnostic
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
    if d.get("status"):  # bounced
        text += f": {_clean(d['status'])} {_q(d.get('diagnostic') or '', 120)}"
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
    """``masd case list``: a header row, then one row per case.

    ``doc`` is :func:`masd.read.case_views.cases_json`'s page.
    """
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


def format_text(text: str, indent: str = "    | ") -> list[str]:
    """A mail's text for a terminal: each line indented, control characters shown."""
    return [indent + _clean(line, 1000) for line in text.rstrip("\n").split("\n")] if text else []


def format_case(
    case: Mapping[str, Any],
    thread: Mapping[str, Any] | None = None,
    texts: Mapping[str, str] | None = None,
) -> str:
    """A readable page for an operator: the case, its handoffs, then one line per entry.

    ``case`` is :func:`masd.read.case_views.case_json`'s document (or its inner ``"case"``),
    ``thread`` :func:`masd.read.case_views.thread_json`'s (entries shown in the order given).
    ``texts``: the text of each ``mail.in`` by its ``message_ref``, shown below its line
    (its ``reply_text``, or its whole ``text`` when the caller chose it).
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
    for e in entries:
        lines.append(format_entry(e))
        if e.get("kind") == "mail.in" and texts:
            lines.extend(format_text(texts.get(str(e.get("message_ref")), "")))
    return "\n".join(lines) + "\n"


def format_message(doc: Mapping[str, Any], *, whole: bool = False) -> str:
    """``masd message show``: the message's record, its event's fields, its attachments
    (by index, as ``--attachment N`` takes them), its reply text and, with ``whole``,
    its whole text."""
    m = doc.get("message", doc)
    ev = m.get("event") or {}
    case = m.get("case")
    sender = ev.get("from") or {}
    lines = [
        f"message {_clean(m.get('message_ref'))}  received {m.get('received_at')}",
        f"  case {_clean(case['address']) if case else '(pending intake)'}"
        + (f", intake {_clean(m['intake_ref'])}" if m.get("intake_ref") else ""),
        f"  {m.get('size')} bytes, sha256 {m.get('sha256')}",
        f"  from {_clean(sender.get('address') or '(no From)')}"
        + (f" ({_q(sender['name'])})" if sender.get("name") else ""),
        f"  to {_clean(ev.get('rcpt_to'))}, envelope from {_clean(ev.get('mail_from') or '<>')}",
        f"  subject {_q(ev.get('subject') or '')}",
        f"  message-id {_clean(ev.get('message_id') or '(none)')}",
    ]
    auth, auto = ev.get("auth") or {}, ev.get("automated") or {}
    line = f"  dmarc={_clean(auth.get('dmarc'))}"
    if auto.get("is"):
        line += f"  automated ({_clean(auto.get('reason'))})"
    lines.append(line)
    attachments = ev.get("attachments") or []
    lines.append(f"attachments ({len(attachments)}):")
    for n, a in enumerate(attachments):
        lines.append(
            f"  {n}  {_q(a.get('filename') or '(no name)')}  {_clean(a.get('content_type'))}"
            f"  {a.get('size')} bytes  sha256 {a.get('sha256')}"
        )
    text = str(ev.get("text") or "")
    reply = str(ev.get("reply_text") or text)
    lines.append("reply (the sender's own words):")
    lines.extend(format_text(reply, "  | "))
    if whole:
        lines.append("text (whole):")
        lines.extend(format_text(text, "  | "))
    elif reply != text:
        lines.append("  (quoted mail or a signature left out: --whole-text shows the whole text)")
    return "\n".join(lines) + "\n"


_INTAKE_COLUMNS: Final = ("INTAKE", "STATE", "TYPE", "MODE", "RECEIVED", "MESSAGE", "CASE")


def format_intakes(doc: Mapping[str, Any]) -> str:
    """``masd intake list``: a header row, then one row per intake, oldest first."""
    rows = [list(_INTAKE_COLUMNS)]
    for i in doc.get("intakes") or []:
        case = i.get("case")
        rows.append(
            [
                _clean(i.get("intake_ref")),
                "assigned" if case else "pending",
                f"{_clean(i.get('type'))}@{_clean(i.get('domain'))}",
                _clean(i.get("requested_mode") or "-"),
                str(i.get("created_at")),
                _clean(i.get("message_ref")),
                _clean(case["key"]) if case else "-",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_INTAKE_COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- masd queue


_COLUMNS: Final = ("ID", "STATE", "ATTEMPTS", "CREATED", "NEXT TRY", "CASE", "WHAT")


def _what(item: dict[str, Any]) -> str:
    if item["kind"] == "contract":
        return f"{item.get('type')} {item.get('message_id')} to {item.get('peer')}"
    return f"mail {item.get('message_id') or '(no Message-ID)'} to {item.get('to')}"


def format_items(items: Sequence[dict[str, Any]]) -> str:
    """``masd queue``: a header row, one row per item, its last error on the next line."""
    table = [list(_COLUMNS)]
    errors: list[str | None] = [None]
    for it in items:
        table.append(
            [
                str(it["id"]),
                it["state"],
                str(it["attempts"]),
                str(it["created_at"]),
                str(it["next_attempt_at"] or "-"),
                str(it["case"] or "-"),
                _what(it),
            ]
        )
        errors.append(it.get("last_error"))
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS) - 1)]
    lines = []
    for r, error in zip(table, errors, strict=True):
        cells = [v.ljust(w) for v, w in zip(r, widths, strict=False)] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
        if error:
            lines.append(f"    last error: {json.dumps(error, ensure_ascii=False)[:300]}")
    count = len(items)
    lines.append(f"{count} item{'' if count == 1 else 's'}")
    return "\n".join(lines) + "\n"
