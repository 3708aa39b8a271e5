"""A thread entry as one row of a case's timeline (docs/protocol.md §16).

:func:`row` turns an entry (the read side's JSON, :func:`masd.read.case_views.entry_json`)
into plain text fields; :func:`row_html` puts them in the page, escaped, and the live feed
sends the same fields to the script, which sets them as text.  So a row looks the same
whether the page was rendered with it or it arrived while the page was open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from masd.console.markup import Html, esc

#: Fields of an entry that :func:`row` shows in columns of their own.
_SHOWN: Final = frozenset({"seq", "kind", "at", "delivery"})


def _quoted(text: object) -> str:
    return f"“{text}”" if text else "(no subject)"


def _mail_in(e: Mapping[str, Any]) -> str:
    text = f"from {e.get('from') or 'an unknown sender'}: {_quoted(e.get('subject'))}"
    if e.get("requested_mode"):
        text += f"; asks for {e['requested_mode']}"
    if e.get("dmarc"):
        text += f"; DMARC {e['dmarc']}"
    return text + ("; automated" if e.get("automated") else "")


def _mail_out(e: Mapping[str, Any]) -> str:
    text = f"to {e.get('to')}: {_quoted(e.get('subject'))}"
    return text + (f" ({e['purpose']})" if e.get("purpose") else "")


def _mail_refused(e: Mapping[str, Any]) -> str:
    text = f"not sent to {e.get('to') or 'anyone'}: {e.get('reason')}"
    return text + (f" ({e['purpose']})" if e.get("purpose") else "")


def _status(e: Mapping[str, Any]) -> str:
    text = f"{e.get('mode') or 'handoff'} {e.get('handoff_id')}: {e.get('status')}"
    extras = [f"{name} {e[name]}" for name in ("reason", "outcome", "detail") if e.get(name)]
    if e.get("needs"):
        extras.append("needs " + ", ".join(str(n) for n in e["needs"]))
    if e.get("source"):
        extras.append(f"by {e['source']}")
    return text + (" (" + "; ".join(extras) + ")" if extras else "")


def _contract_in(e: Mapping[str, Any]) -> str:
    return f"{e.get('type')} {e.get('id')}"


def _contract_out(e: Mapping[str, Any]) -> str:
    return f"{e.get('type')} to {e.get('peer')} ({e.get('id')})"


def _delivery_failed(e: Mapping[str, Any]) -> str:
    what = e.get("type") or "mail"
    return f"{what} to {e.get('to') or e.get('peer')}: {e.get('detail')}"


def _mail_bounced(e: Mapping[str, Any]) -> str:
    how = "permanent" if e.get("permanent") else "delayed"
    text = f"bounce of mail #{e.get('mail_seq')} to {e.get('recipient')}: {e.get('status')} {how}"
    if e.get("claimed_recipient"):
        text += f" (the report names {e['claimed_recipient']})"
    return text + (f"; {e['diagnostic']}" if e.get("diagnostic") else "")


_SUMMARIES: Final[Mapping[str, Callable[[Mapping[str, Any]], str]]] = {
    "mail.in": _mail_in,
    "mail.out": _mail_out,
    "mail.refused": _mail_refused,
    "status": _status,
    "contract.in": _contract_in,
    "contract.out": _contract_out,
    "delivery.failed": _delivery_failed,
    "mail.bounced": _mail_bounced,
}


def summary(entry: Mapping[str, Any]) -> str:
    """What the entry says, in one line; a kind without a summary of its own shows its data."""
    said = _SUMMARIES.get(str(entry.get("kind")))
    if said is not None:
        return said(entry)
    rest = {k: v for k, v in entry.items() if k not in _SHOWN}
    return json.dumps(rest, ensure_ascii=False, sort_keys=True)


def delivery(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(state, what more is known of it) of an outbound entry; ("", "") for the others."""
    d = entry.get("delivery")
    if not isinstance(d, Mapping):
        return "", ""
    parts = []
    attempts = d.get("attempts")
    if attempts:
        parts.append(f"{attempts} attempt{'s' if attempts != 1 else ''}")
    for name, label in (("status", "status"), ("remote_mta", "from"), ("diagnostic", "")):
        if d.get(name):
            parts.append(f"{label} {d[name]}".strip())
    if d.get("last_error"):
        parts.append(f"last error: {d['last_error']}")
    if d.get("next_attempt_at"):
        parts.append(f"next try {d['next_attempt_at']}")
    if d.get("done_at"):
        parts.append(f"at {d['done_at']}")
    return str(d.get("state") or ""), "; ".join(parts)


def row(entry: Mapping[str, Any]) -> dict[str, str]:
    """The timeline row of an entry: ``seq``, ``at``, ``kind``, ``what``, ``state``, ``more``."""
    state, more = delivery(entry)
    return {
        "seq": str(entry.get("seq", "")),
        "at": str(entry.get("at", "")),
        "kind": str(entry.get("kind", "")),
        "what": summary(entry),
        "state": state,
        "more": more,
    }


def kind_class(kind: str) -> str:
    """The CSS class of an entry kind (``mail.in`` → ``kind-mail-in``)."""
    return "kind-" + "".join(c if c.isalnum() else "-" for c in kind)


def row_html(r: Mapping[str, str]) -> Html:
    """One ``<li>`` of the timeline (the script builds the same from the live feed)."""
    state = (
        f'<span class="delivery state-{esc(kind_class(r["state"])[5:])}">{esc(r["state"])}</span>'
        f'<span class="more">{esc(r["more"])}</span>'
        if r["state"]
        else ""
    )
    return Html(
        f'<li class="entry {esc(kind_class(r["kind"]))}" data-seq="{esc(r["seq"])}">'
        f'<span class="seq">#{esc(r["seq"])}</span>'
        f'<time datetime="{esc(r["at"])}">{esc(r["at"])}</time>'
        f'<span class="kind">{esc(r["kind"])}</span>'
        f'<span class="what">{esc(r["what"])}</span>{state}</li>'
    )
