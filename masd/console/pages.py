"""The console's pages, each a function from read-side documents to a whole HTML page.

The documents are those of :mod:`masd.read` (the JSON bodies of the read side's routes);
``csrf`` is the session's token, put in every form that changes anything.  No page needs
the script to be read: it only adds the live feed and asks before a drop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from masd.console.markup import (
    Html,
    case_href,
    definition_items,
    esc,
    frame,
    href,
    join,
    link,
    notice,
    post_form,
    table,
    when,
)
from masd.console.timeline import COUNTS, counts, row, row_html

#: The console's live feed (Server-Sent Events relayed from the event feed).
EVENTS: Final = "/console/events"

Doc = Mapping[str, Any]


def sign_in(*, refused: str | None = None) -> str:
    """The sign-in form: the admin secret, POSTed; ``refused`` says why the last try failed."""
    body = join(
        [
            notice(refused, "refused"),
            '<form method="post" action="/console/sign-in" class="sign-in">'
            '<label for="secret">Admin secret</label>'
            '<input type="password" id="secret" name="secret" required '
            'autocomplete="current-password" autofocus>'
            '<button type="submit">Sign in</button></form>'
            '<p class="hint">The secret in the file that '
            "<code>server.admin_token_file</code> names.</p>",
        ]
    )
    return frame("Sign in", body)


def error(status: int, title: str, detail: str, csrf: str | None) -> str:
    """A refusal as a page: what was refused and why."""
    body = join([notice(detail, "refused"), f"<p>{link(href('cases'), 'Back to the cases')}</p>"])
    return frame(f"{status} {title}", body, csrf=csrf)


# ----------------------------------------------------------------------------- cases


def _select(name: str, chosen: str | None, options: Sequence[tuple[str, str]]) -> Html:
    items = "".join(
        f'<option value="{esc(v)}"{" selected" if v == (chosen or "") else ""}>{esc(t)}</option>'
        for v, t in options
    )
    return Html(f'<select id="{esc(name)}" name="{esc(name)}">{items}</select>')


def _filters(where: Mapping[str, str | None]) -> Html:
    state = _select(
        "state", where.get("state"), [("", "any"), ("open", "open"), ("closed", "closed")]
    )
    fields = [f'<label for="state">State</label>{state}']
    for name, label in (("participant", "Participant"), ("domain", "Domain")):
        fields.append(
            f'<label for="{name}">{label}</label>'
            f'<input type="text" id="{name}" name="{name}" value="{esc(where.get(name))}">'
        )
    return Html(
        '<form method="get" action="/console/cases" class="filters">'
        + "".join(fields)
        + '<button type="submit">Filter</button></form>'
    )


def _case_row(c: Doc) -> list[Html]:
    handoff = c.get("open_handoff")
    open_one = esc(f"{handoff['mode']} {handoff['status']}") if handoff else esc("—")
    return [
        link(case_href(c["key"]), c["address"]),
        esc(c.get("role")),
        esc(c.get("participant")),
        when(c.get("opened_at")),
        when(c.get("last_activity_at")),
        open_one,
    ]


def _live(feed_after: str, case_key: str | None = None) -> Html:
    query = {"after": feed_after, **({"case": case_key} if case_key else {})}
    source = href("events", **query)
    return Html(
        f'<section class="live" data-feed="{esc(source)}" data-case="{esc(case_key or "")}">'
        '<h2>Live <span class="live-state" aria-live="polite">off (no script)</span></h2>'
        '<p class="hint">Events appear here as they happen.</p>'
        '<ol class="events" id="live-events"></ol></section>'
    )


def cases(doc: Doc, where: Mapping[str, str | None], feed_after: str, csrf: str) -> str:
    """The case list (``GET /mas/v0.1/cases``'s document) with its filters and the live feed."""
    heads = ("Case", "Role", "Participant", "Opened", "Last activity", "Open handoff")
    rows = [_case_row(c) for c in doc["cases"]]
    listing = table(heads, rows, empty="No case matches.", id="cases")
    more = Html("")
    if doc.get("next"):
        more = Html(
            f'<p class="more">{link(href("cases", after=doc["next"], **where), "Older cases")}</p>'
        )
    return frame(
        "Cases",
        join([_filters(where), listing, more, _live(feed_after)]),
        current="cases",
        csrf=csrf,
    )


# ----------------------------------------------------------------------------- one case


def _handoffs(items: Iterable[Doc]) -> Html:
    heads = ("Handoff", "Mode", "Status", "Seq", "Requested", "Deadline", "Closed")
    rows = [
        [
            esc(h.get("handoff_id")),
            esc(h.get("mode")),
            esc(h.get("status")),
            esc(h.get("seq")),
            when(h.get("requested_at")),
            when(h.get("deadline_at")),
            when(h.get("closed_at")),
        ]
        for h in items
    ]
    return table(heads, rows, empty="No handoff yet.")


def _about(c: Doc, counted: Mapping[str, int]) -> Html:
    """What the case is, then its counts, each ``data-count`` so the script keeps it
    in step with the rows that arrive."""
    about = definition_items(
        [
            ("Address", c.get("address")),
            ("Key", c.get("key")),
            ("Role", c.get("role")),
            ("Participant", c.get("participant")),
            ("Created", c.get("created_at")),
        ]
    )
    shown = "".join(
        f'<dt>{esc(label)}</dt><dd data-count="{esc(name)}">{esc(counted.get(name, 0))}</dd>'
        for name, label in COUNTS
    )
    return Html(f"<dl>{about}{shown}</dl>")


def case(
    case_doc: Doc,
    thread: Doc,
    feed_after: str,
    csrf: str,
    *,
    limit: int,
    messages: Mapping[str, Doc] | None = None,
    counted: Mapping[str, int] | None = None,
) -> str:
    """One case: what it is and its counts, its handoffs, and its thread as a timeline
    that grows live.  ``messages``: the message of each ``mail.in`` by ``message_ref``
    (the body of ``GET /messages/{ref}``'s ``message``), shown in its row; ``counted``:
    the counts of the whole thread (:func:`masd.console.timeline.counts`), by default
    those of this page's rows."""
    c = case_doc["case"]
    found = messages or {}
    rows = [row(e, found.get(str(e.get("message_ref")))) for e in thread["entries"]]
    about = _about(c, counts(rows) if counted is None else counted)
    entries = thread["entries"]
    items = "".join(row_html(r) for r in rows)
    full = len(entries) >= limit  # later entries are on the next page: not followed here
    source = "" if full else f' data-feed="{esc(href("events", after=feed_after, case=c["key"]))}"'
    timeline = Html(f'<ol class="timeline" id="timeline"{source}>{items}</ol>')
    if not entries:
        timeline = Html(f'<p class="empty" id="timeline-empty">Nothing yet.</p>{timeline}')
    more = Html("")
    if full:
        later = case_href(c["key"], after=str(thread["next"]))
        more = Html(f'<p class="more">{link(later, "Later entries")}</p>')
    body = join(
        [
            about,
            "<h2>Handoffs</h2>",
            _handoffs(c.get("handoffs", ())),
            '<h2>Thread <span class="live-state" aria-live="polite">off (no script)</span></h2>',
            timeline,
            more,
        ]
    )
    return frame(str(c.get("address")), body, current="cases", csrf=csrf)


# ----------------------------------------------------------------------------- the queue


def _queue_row(item: Doc, csrf: str) -> list[Html]:
    what = item.get("type") if item.get("kind") == "contract" else item.get("subject")
    where = item.get("peer") if item.get("kind") == "contract" else item.get("to")
    actions = Html("")
    if item.get("state") in ("queued", "retrying", "failed"):
        base = f"/console/outbox/{int(item['id'])}"
        actions = join(
            [
                post_form(base + "/retry", csrf, "Retry", cls="retry"),
                post_form(
                    base + "/drop", csrf, "Drop", cls="drop", confirm=f"Drop item {item['id']}?"
                ),
            ]
        )
    case_key = item.get("case")
    return [
        esc(item.get("id")),
        esc(item.get("kind")),
        link(case_href(case_key), case_key) if case_key else esc("—"),
        esc(what),
        esc(where),
        Html(
            f'<span class="delivery state-{esc(item.get("state"))}">{esc(item.get("state"))}</span>'
        ),
        esc(item.get("attempts")),
        esc(item.get("last_error")),
        when(item.get("next_attempt_at") or item.get("done_at")),
        Html(f'<div class="actions">{actions}</div>'),
    ]


def outbox(listing: Doc, csrf: str, *, done: str | None = None) -> str:
    """What waits to go out and what failed, each with retry and drop."""
    heads = ("Item", "Kind", "Case", "What", "To", "State", "Attempts", "Last error", "When", "")
    rows = [_queue_row(item, csrf) for item in listing["items"]]
    body = join(
        [
            notice(done),
            post_form("/console/outbox/retry", csrf, "Retry every waiting item", cls="retry-all"),
            table(heads, rows, empty="Nothing waits to go out, and nothing failed.", id="outbox"),
        ]
    )
    return frame("Outbox", body, current="outbox", csrf=csrf)


# ----------------------------------------------------------------------------- the rest


def intakes(items: Sequence[Doc], csrf: str) -> str:
    """Slave-role intakes a master has not assigned to a case yet."""
    heads = ("Intake", "Domain", "Type", "Mode asked", "From", "Subject", "Received")
    names = ("intake_ref", "domain", "type", "requested_mode", "from", "subject", "received_at")
    rows = [[esc(i.get(n)) for n in names] for i in items]
    body = table(heads, rows, empty="No intake is waiting for its master.", id="intakes")
    return frame("Pending intakes", body, current="intakes", csrf=csrf)


def suppressions(items: Sequence[Doc], csrf: str) -> str:
    """Recipients masd does not write to after a permanent bounce."""
    heads = ("Address", "Status", "Since", "Until")
    names = ("address", "status", "since", "until")
    rows = [[esc(i.get(n)) for n in names] for i in items]
    body = table(heads, rows, empty="No suppression is recorded.", id="suppressions")
    return frame("Suppressions", body, current="suppressions", csrf=csrf)


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def _series(series: Mapping[Any, float]) -> str:
    """A gauge's values in one line: each labelled value not 0, then how many are 0."""
    if not series:
        return "none"
    shown, zero = [], 0
    for labels, value in sorted(series.items()):
        if not labels:
            return _value(value)
        if value == 0:
            zero += 1
            continue
        shown.append(", ".join(f"{k}={v}" for k, v in labels) + f": {_value(value)}")
    if zero:
        shown.append(f"{'the other ' if shown else ''}{zero} at 0" if len(series) > 1 else "0")
    return "; ".join(shown)


def health(healthz: Doc, gauges: Mapping[str, tuple[str, Mapping[Any, float]]], csrf: str) -> str:
    """What ``/healthz`` says and the store's gauges (as ``/metrics`` gives them)."""
    ok = bool(healthz.get("ok"))
    verdict = Html(
        f'<p class="verdict {"ok" if ok else "failing"}">'
        f"<code>/healthz</code>: {esc('200 ok' if ok else '503 store')}"
        f" — {esc(healthz.get('detail'))}</p>"
    )
    rows = [
        [Html(f"<code>{esc(name)}</code>"), esc(_series(series)), esc(help_text)]
        for name, (help_text, series) in sorted(gauges.items())
    ]
    gauge_table = table(("Gauge", "Value", "Meaning"), rows, empty="No gauge.", id="gauges")
    body = join([verdict, "<h2>Store gauges</h2>", gauge_table])
    return frame("Health", body, current="health", csrf=csrf)
