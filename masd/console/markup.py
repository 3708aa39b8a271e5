"""The console's HTML: escaping, the page frame, tables and forms.

Every value that comes from the store, the configuration or a request passes through
:func:`esc` (:func:`html.escape`, quotes included) before it is part of a page; the
fragments built here are :class:`Html`, text already safe to put in a page, so a page is
assembled from escaped values and fragments only.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Final, NewType
from urllib.parse import quote, urlencode

#: HTML text that is safe to put in a page as it is.
Html = NewType("Html", str)

ROOT: Final = "/console/"
STATIC: Final = ROOT + "static/"
#: The pages in the navigation bar: (path under ROOT, title).
NAV: Final = (
    ("cases", "Cases"),
    ("outbox", "Outbox"),
    ("intakes", "Intakes"),
    ("suppressions", "Suppressions"),
    ("health", "Health"),
)
#: The name of the CSRF token in every form that changes anything.
CSRF_FIELD: Final = "csrf"


def esc(value: object) -> Html:
    """``value`` as text in HTML (None is an empty string)."""
    return Html(html.escape("" if value is None else str(value), quote=True))


def when(stamp: object) -> Html:
    """An RFC 3339 time from the read side, as a ``<time>`` (a dash when there is none)."""
    if not stamp:
        return esc("—")
    return Html(f'<time datetime="{esc(stamp)}">{esc(stamp)}</time>')


def join(parts: Iterable[str]) -> Html:
    return Html("".join(parts))


def href(path: str, **query: str | None) -> str:
    """A console URL: ``ROOT + path`` with the query parameters that are set."""
    given = {k: v for k, v in query.items() if v}
    return ROOT + path + ("?" + urlencode(given) if given else "")


def case_href(key: str, **query: str | None) -> str:
    """The page of the case ``key`` (percent-encoded in the path)."""
    return href("cases/" + quote(key, safe=""), **query)


def link(url: str, text: object, cls: str = "") -> Html:
    klass = f' class="{esc(cls)}"' if cls else ""
    return Html(f'<a href="{esc(url)}"{klass}>{esc(text)}</a>')


def table(
    heads: Sequence[str], rows: Iterable[Sequence[Html]], *, empty: str, id: str = ""
) -> Html:
    """A table of rows (cells already :class:`Html`); ``empty`` says what none means."""
    body = ["<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows]
    if not body:
        return Html(f'<p class="empty">{esc(empty)}</p>')
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in heads)
    ident = f' id="{esc(id)}"' if id else ""
    return Html(
        f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def definition_items(pairs: Iterable[tuple[str, object]]) -> Html:
    """The ``<dt>``/``<dd>`` of label and value (values escaped; None shown as a dash)."""
    return join(
        f"<dt>{esc(k)}</dt><dd>{esc('—' if v is None or v == '' else v)}</dd>" for k, v in pairs
    )


def post_form(action: str, csrf: str, label: str, *, cls: str = "", confirm: str = "") -> Html:
    """A one-button form that POSTs to ``action`` with the session's CSRF token.

    ``confirm``: a question the script asks before it is sent (without the script the
    form is sent at once, as any form).
    """
    data = f' data-confirm="{esc(confirm)}"' if confirm else ""
    klass = f' class="{esc(cls)}"' if cls else ""
    return Html(
        f'<form method="post" action="{esc(action)}"{klass}{data}>'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(csrf)}">'
        f'<button type="submit">{esc(label)}</button></form>'
    )


def notice(text: str | None, cls: str = "notice") -> Html:
    return Html(f'<p class="{esc(cls)}" role="status">{esc(text)}</p>') if text else Html("")


def _nav(current: str) -> Html:
    items = []
    for path, title in NAV:
        mark = ' aria-current="page"' if path == current else ""
        items.append(f'<li><a href="{esc(href(path))}"{mark}>{esc(title)}</a></li>')
    return Html(f"<nav><ul>{''.join(items)}</ul></nav>")


def frame(title: str, body: Html, *, current: str = "", csrf: str | None = None) -> str:
    """The whole page: head (the console's style sheet and script, nothing else), the
    navigation and the sign-out form when signed in (``csrf``), then ``body``."""
    header = f'<a class="brand" href="{esc(href("cases"))}">masd console</a>'
    if csrf is not None:
        header += _nav(current) + post_form(ROOT + "sign-out", csrf, "Sign out", cls="sign-out")
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · masd console</title>"
        f'<link rel="icon" href="{STATIC}favicon.svg" type="image/svg+xml">'
        f'<link rel="stylesheet" href="{STATIC}console.css">'
        f'<script src="{STATIC}console.js" defer></script>'
        f"</head><body><header>{header}</header>"
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>\n"
    )
