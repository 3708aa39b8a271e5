"""A thread entry as one row of a case's timeline (docs/protocol.md §16).

:func:`row` turns an entry (the read side's JSON, :func:`masd.read.case_views.entry_json`)
into plain text fields; :func:`row_html` puts them in the page, escaped, and the live feed
sends the same fields to the script, which sets them as text.  So a row looks the same
whether the page was rendered with it or it arrived while the page was open.

A ``mail.in`` row also shows the mail itself (:func:`mail_part`, from the message the read
side holds): the sender's own words (the event's ``reply_text``, its ``text`` where there
is none), the whole text behind a ``<details>``, a link to each attachment and to the raw
message, under ``/console/messages/`` (served with the console's session).  Each row also
says what it adds to the counts in the case's header (:func:`tally`), so the page counts
the thread with the same rule the script follows as rows arrive.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote

from masd.console.markup import ROOT, Html, esc

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


#: The counts in a case's header, in order: (name, label).
COUNTS: Final = (
    ("entries", "Entries"),
    ("mails_in", "Mails in"),
    ("attachments", "Attachments"),
    ("statuses", "Statuses"),
    ("mails_sent", "Mails sent"),
)
_COUNTED: Final = {"mail.in": "mails_in", "status": "statuses", "mail.out": "mails_sent"}


def message_href(message_ref: str, *rest: str) -> str:
    """The console's path of a message's bytes (``raw``, ``attachments/N``)."""
    return ROOT + "messages/" + "/".join([quote(message_ref, safe=""), *rest])


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "size unknown"
    return f"{n} byte{'s' if n != 1 else ''}" if n < 10_000 else f"{n / 1024:,.0f} KiB"


def own_words(event: Mapping[str, Any]) -> str:
    """What the sender wrote: the event's ``reply_text``; its ``text`` where it has none."""
    reply = event.get("reply_text")
    return str(reply if isinstance(reply, str) else event.get("text") or "")


def mail_part(message: Mapping[str, Any]) -> dict[str, Any]:
    """The mail of a ``mail.in`` row, from the read side's message (``message`` of
    ``GET /messages/{ref}``): its words, its whole text, its attachments and raw bytes."""
    event: Mapping[str, Any] = message.get("event") or {}
    ref = str(message.get("message_ref", ""))
    text, reply = str(event.get("text") or ""), own_words(event)
    listed = event.get("attachments") or []
    return {
        "reply": reply,
        "text": text,
        "whole": "The whole text"
        if reply.strip() != text.strip()
        else "The whole text (nothing was left out)",
        "attachments": [
            {
                "name": str(a.get("filename") or f"attachment {n + 1}"),
                "about": f"{a.get('content_type') or 'application/octet-stream'}, "
                f"{_size(a.get('size'))}",
                "href": message_href(ref, "attachments", str(n)),
            }
            for n, a in enumerate(listed)
        ],
        "raw": message_href(ref, "raw"),
        "raw_about": _size(message.get("size")),
    }


def tally(kind: str, mail: Mapping[str, Any] | None) -> dict[str, int]:
    """What an entry of ``kind`` (with its ``mail`` part) adds to the header's counts."""
    adds = {"entries": 1}
    if kind in _COUNTED:
        adds[_COUNTED[kind]] = 1
    if mail is not None and mail["attachments"]:
        adds["attachments"] = len(mail["attachments"])
    return adds


def counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The header's counts of a thread: the sum of its rows' tallies."""
    total = {name: 0 for name, _ in COUNTS}
    for r in rows:
        for name, n in r["tally"].items():
            total[name] += n
    return total


def row(entry: Mapping[str, Any], message: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The timeline row of an entry: ``seq``, ``at``, ``kind``, ``what``, ``state``, ``more``,
    ``mail`` (a ``mail.in`` whose ``message`` is given, else None) and ``tally``."""
    state, more = delivery(entry)
    kind = str(entry.get("kind", ""))
    mail = mail_part(message) if kind == "mail.in" and message is not None else None
    return {
        "seq": str(entry.get("seq", "")),
        "at": str(entry.get("at", "")),
        "kind": kind,
        "what": summary(entry),
        "state": state,
        "more": more,
        "mail": mail,
        "tally": tally(kind, mail),
    }


def kind_class(kind: str) -> str:
    """The CSS class of an entry kind (``mail.in`` → ``kind-mail-in``)."""
    return "kind-" + "".join(c if c.isalnum() else "-" for c in kind)


def mail_html(mail: Mapping[str, Any] | None) -> Html:
    """The mail of a row: its words, the whole text a click away, its links."""
    if mail is None:
        return Html("")
    words = (
        f'<p class="reply">{esc(mail["reply"])}</p>'
        if mail["reply"]
        else '<p class="reply empty">(no words of the sender\'s own)</p>'
    )
    whole = (
        f'<details class="whole"><summary>{esc(mail["whole"])}</summary>'
        f'<pre class="text">{esc(mail["text"])}</pre></details>'
    )
    files = "".join(
        f'<li><a class="attachment" href="{esc(a["href"])}" download>{esc(a["name"])}</a> '
        f'<span class="about">{esc(a["about"])}</span></li>'
        for a in mail["attachments"]
    )
    listed = f'<ul class="attachments">{files}</ul>' if files else ""
    raw = (
        f'<p class="raw"><a href="{esc(mail["raw"])}" download>Raw message</a> '
        f'<span class="about">{esc(mail["raw_about"])}</span></p>'
    )
    return Html(f'<div class="mail">{words}{whole}{listed}{raw}</div>')


def row_html(r: Mapping[str, Any]) -> Html:
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
        f'<span class="what">{esc(r["what"])}</span>{state}{mail_html(r.get("mail"))}</li>'
    )
