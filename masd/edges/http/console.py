"""The operator console at ``/console/`` (``server.console``; docs/operations.md §10).

Read-only pages of cases, a case's thread, the outbound queue (with retry and drop), pending
intakes, suppressions and health, rendered by :mod:`masd.console.pages` from the read side's
documents.  Off, every path here is ``404`` (:mod:`masd.edges.http.auth`).

- **Signing in**: the admin secret, POSTed by a form, opens a session
  (:mod:`masd.console.sessions`) whose token is the cookie :data:`COOKIE` (``HttpOnly``,
  ``SameSite=Strict``, ``Path=/console/``, ``Secure`` when ``server.public_url`` is https).
  A page asked for without a live session sends the browser to the sign-in page.
- **Changes** (retry, drop, sign-out) are POSTs carrying the session's CSRF token; a POST
  without it, or with another, is ``403``.  Each change answers with a redirect to the page
  it was made from, which says what it did.
- **Every answer** under ``/console/`` carries :data:`SECURITY_HEADERS`, refusals
  included (:func:`guard`, run as each answer's headers are sent): the page loads only
  what masd serves (``default-src 'self'``), may not be framed, and is not cached.
- **The mail itself**: ``/console/messages/{ref}/raw`` and ``…/attachments/{n}`` are the
  read side's own routes run for the session as the admin, answered as downloads
  (:mod:`masd.edges.http.console_mail`).
- **Sign-in is throttled** per client address (:mod:`masd.console.throttle`): after a few
  wrong secrets each try waits longer, and one made too soon is ``429`` with
  ``Retry-After``, unread; one log line per throttled client per interval.
- **Live**: ``/console/events`` relays the event feed as Server-Sent Events to a signed-in
  page, each event with its timeline row; the admin secret never reaches the page.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

from aiohttp import hdrs, web

import masd.console
from masd.console import pages
from masd.console.markup import CSRF_FIELD
from masd.console.sessions import Session
from masd.console.throttle import Throttled, client_of
from masd.console.timeline import counts, row
from masd.edges.http import console_mail
from masd.edges.http.console_mail import DOWNLOAD
from masd.edges.http.shared import (
    CONSOLE_PATH,
    Handler,
    HttpRefusal,
    Route,
    Served,
    stored,
)
from masd.metrics import health_gauges, store_gauges
from masd.read import case_views as readside
from masd.read import console_case, console_lists, feed, queue_items
from masd.service import queue_actions as queue
from masd.store import StoreError

log = logging.getLogger("masd.http")

#: The session cookie.
COOKIE: Final = "masd_console"
ROOT: Final = CONSOLE_PATH + "/"
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    hdrs.CACHE_CONTROL: "no-store",
}
_HTML: Final = "text/html"
#: The style sheet, the script and the icon, read once: name -> (content type, bytes).
_STATIC_DIR: Final = Path(masd.console.__file__).resolve().parent / "static"
STATIC: Final = {
    "console.css": ("text/css", (_STATIC_DIR / "console.css").read_bytes()),
    "console.js": ("text/javascript", (_STATIC_DIR / "console.js").read_bytes()),
    "favicon.svg": ("image/svg+xml", (_STATIC_DIR / "favicon.svg").read_bytes()),
}
#: Seconds of silence after which the live feed sends a keep-alive comment.
KEEPALIVE_SECONDS: Final = 15.0
#: Entries of a case's thread on one page.
THREAD_PAGE: Final = 500

#: A page's handler once its session is found.
Page = Callable[[web.Request, Served, Session], Awaitable[web.StreamResponse]]


# ----------------------------------------------------------------------------- answers


def under_console(path: str) -> bool:
    return path == CONSOLE_PATH or path.startswith(ROOT)


async def guard(request: web.Request, response: web.StreamResponse) -> None:
    """The application's ``on_response_prepare``: every answer under ``/console/``
    carries :data:`SECURITY_HEADERS` (and a download its :data:`DOWNLOAD` headers), a
    refusal of the middleware too (a path no route serves, a method not allowed, a body
    too large, the console off), and one streamed by another module."""
    if under_console(request.path):
        response.headers.update(SECURITY_HEADERS)
        response.headers.update(request.get(DOWNLOAD, {}))


def html(text: str, status: int = 200) -> web.StreamResponse:
    return web.Response(text=text, status=status, content_type=_HTML, charset="utf-8")


def see_other(location: str) -> web.StreamResponse:
    """303: the browser GETs ``location`` (after a form, or to sign in)."""
    return web.Response(status=303, headers={hdrs.LOCATION: location})


def _refused(status: int, title: str, detail: str, session: Session | None) -> web.StreamResponse:
    return html(pages.error(status, title, detail, session.csrf if session else None), status)


def _secret(served: Served) -> str | None:
    return served.rt.config.server.admin_token


def session_of(request: web.Request, served: Served) -> Session | None:
    """The live session the request's cookie names, if any."""
    token = request.cookies.get(COOKIE)
    return served.sessions.find(token, _secret(served), served.clock.now())


async def form_field(request: web.Request, name: str) -> str | None:
    """The text field ``name`` of the request's form (urlencoded or multipart); None when
    it has none.  A form that cannot be read (not UTF-8, a malformed multipart body) is
    ``400``, a page of its own."""
    try:
        form = await request.post()
    except ValueError as exc:  # UnicodeDecodeError too
        raise HttpRefusal("invalid-message", f"the form cannot be read: {exc}") from exc
    value = form.get(name)
    return value if isinstance(value, str) else None


def signed_in(page: Page, *, change: bool = False) -> Handler:
    """``page`` for a live session; without one a GET is sent to sign in and anything else
    is 401.  ``change``: the form must carry the session's CSRF token, else 403.  A refusal
    raised by the page (a store that fails) is answered as a page too."""

    @functools.wraps(page)
    async def handle(request: web.Request, served: Served) -> web.StreamResponse:
        session = session_of(request, served)
        if session is None:
            if request.method in (hdrs.METH_GET, hdrs.METH_HEAD):
                return see_other(ROOT + "sign-in")
            return _refused(401, "Not signed in", "sign in first: no live console session", None)
        try:
            given = await form_field(request, CSRF_FIELD) if change else None
        except HttpRefusal as refusal:
            return _refused(refusal.status, refusal.kind, refusal.detail, session)
        if change and not session.csrf_matches(given):
            why = "missing" if given is None else "not this session's"
            log.info("console refused remote=%s path=%s csrf=%s", request.remote, request.path, why)
            detail = f"the form's CSRF token is {why}: reload the page and try again"
            return _refused(403, "Refused", detail, session)
        try:
            return await page(request, served, session)
        except HttpRefusal as refusal:
            return _refused(refusal.status, refusal.kind, refusal.detail, session)

    return handle


# ----------------------------------------------------------------------------- signing in


async def to_cases(request: web.Request, served: Served) -> web.StreamResponse:
    return see_other(ROOT + "cases")


async def sign_in_page(request: web.Request, served: Served) -> web.StreamResponse:
    if session_of(request, served) is not None:
        return see_other(ROOT + "cases")
    return html(pages.sign_in())


async def sign_in(request: web.Request, served: Served) -> web.StreamResponse:
    """The admin secret from the form opens a session.  A client that gave a wrong one too
    often (:mod:`masd.console.throttle`) is refused ``429`` with ``Retry-After``, its
    secret unread, until its wait is over.  The form is read first, so from the throttle's
    look to its count nothing awaits: tries sent at once are counted one by one."""
    try:
        given = await form_field(request, "secret")
    except HttpRefusal as refusal:
        return html(pages.sign_in(refused=refusal.detail), refusal.status)
    throttle, client, now = served.sessions.throttle, client_of(request.remote), served.clock.now()
    waiting = throttle.refuse(client, now)
    if waiting is not None:
        _log_throttled(request, waiting)
        said = f"Too many wrong secrets from your address: try again in {_secs(waiting)}."
        return _with_retry(html(pages.sign_in(refused=said), 429), waiting)
    token = _secret(served)
    if token is None:
        return html(pages.sign_in(refused="no admin secret is configured"), 401)
    if given is None or not hmac.compare_digest(given.strip().encode(), token.encode()):
        log.info("console sign-in refused remote=%s", request.remote)
        waiting = throttle.failed(client, now)
        if waiting is None:
            return html(pages.sign_in(refused="That is not the admin secret."), 401)
        _log_throttled(request, waiting)
        said = f"That is not the admin secret. Wait {_secs(waiting)} before trying again."
        return _with_retry(html(pages.sign_in(refused=said), 401), waiting)
    throttle.succeeded(client)
    cookie, _ = served.sessions.open(token, now)
    log.info("console sign-in remote=%s sessions=%d", request.remote, len(served.sessions))
    response = see_other(ROOT + "cases")
    secure = served.rt.config.server.public_url.lower().startswith("https:")
    response.set_cookie(COOKIE, cookie, path=ROOT, httponly=True, samesite="Strict", secure=secure)
    return response


def _log_throttled(request: web.Request, waiting: Throttled) -> None:
    """A line when one is due: one per throttled client per interval, not one per try."""
    if waiting.log_refused is not None:
        log.warning(
            "console sign-in throttled remote=%s failures=%d retry_after=%d refused_since=%d",
            request.remote,
            waiting.failures,
            waiting.retry_after,
            waiting.log_refused,
        )


def _secs(waiting: Throttled) -> str:
    n = waiting.retry_after
    return f"{n} second{'s' if n != 1 else ''}"


def _with_retry(response: web.StreamResponse, waiting: Throttled) -> web.StreamResponse:
    response.headers[hdrs.RETRY_AFTER] = str(waiting.retry_after)
    return response


async def _sign_out(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    served.sessions.close(request.cookies.get(COOKIE))
    log.info("console sign-out remote=%s", request.remote)
    response = see_other(ROOT + "sign-in")
    response.del_cookie(COOKIE, path=ROOT)
    return response


async def static(request: web.Request, served: Served) -> web.StreamResponse:
    found = STATIC.get(request.match_info["name"])
    if found is None:
        raise HttpRefusal("not-found", f"path: {request.path} is not served here")
    kind, body = found
    return web.Response(body=body, content_type=kind, charset="utf-8")


# ----------------------------------------------------------------------------- pages


def _where(request: web.Request) -> dict[str, str | None]:
    q = request.query
    return {
        name: (q.get(name) or "").strip()[:320] or None
        for name in ("state", "participant", "domain")
    }


async def _cases(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    where = _where(request)
    if where["state"] not in (None, *readside.CASE_STATES):
        raise HttpRefusal("invalid-message", f"state: {where['state']!r} is not open or closed")
    text = request.query.get("after")
    after = None if not text else readside.parse_case_cursor(text)
    if text and after is None:
        raise HttpRefusal(
            "invalid-message", f"after: {text[:40]!r} is not a cursor of the case list"
        )
    filters = readside.CaseFilter(where["state"], where["participant"], where["domain"])

    def read(tx: Any) -> tuple[dict[str, Any], str]:
        found = readside.cases_json(tx, after, readside.DEFAULT_CASES, filters)
        return found, feed.latest(tx, 1).next

    doc, latest = await stored(served.store.read(read))
    return html(pages.cases(doc, where, latest, session.csrf))


async def _case(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    key = request.match_info["key"]
    text = request.query.get("after", "0")
    if not (text.isascii() and text.isdigit() and len(text) < 19):
        raise HttpRefusal("invalid-message", f"after: {text[:40]!r} is not a seq of the thread")
    after = int(text)

    found = await stored(
        served.store.read(lambda tx: console_case.case_page(tx, key, after, THREAD_PAGE))
    )
    if found is None:
        raise HttpRefusal("unknown-case", f"no case {key}")
    counted = counts(row(e, found.mails.get(str(e.get("message_ref")))) for e in found.whole)
    page = pages.case(
        found.case,
        found.thread,
        found.feed_after,
        session.csrf,
        limit=THREAD_PAGE,
        messages=found.mails,
        counted=counted,
    )
    return html(page)


async def _outbox(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    listing = await stored(
        served.store.read(lambda tx: queue_items.listing(tx, queue_items.MAX_ITEMS))
    )
    return html(pages.outbox(listing, session.csrf, done=session.take_flash()))


async def _intakes(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    items = await stored(served.store.read(console_lists.pending_intakes))
    return html(pages.intakes(items, session.csrf))


async def _suppressions(
    request: web.Request, served: Served, session: Session
) -> web.StreamResponse:
    items = await stored(served.store.read(console_lists.suppressions))
    return html(pages.suppressions(items, session.csrf))


async def _health(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    """What ``/healthz`` would answer, and the store's gauges of ``/metrics``."""
    try:
        health = await served.store.check()
        verdict = {"ok": health.writable, "detail": health.describe()}
    except Exception as exc:  # noqa: BLE001 - any failure means "not healthy", as /healthz says
        log.warning("console health: store unavailable: %s", exc)
        verdict = {"ok": False, "detail": "the store does not answer (see the log)"}
    try:
        gauges = await served.store.read(store_gauges)
    except StoreError as exc:
        log.warning("console health: no gauges: %s", exc)
        gauges = {}
    gauges.update(health_gauges(served.store.health))
    return html(pages.health(verdict, gauges, session.csrf))


# ----------------------------------------------------------------------------- queue changes


async def _retry_waiting(
    request: web.Request, served: Served, session: Session
) -> web.StreamResponse:
    now = served.clock.now()
    done = await stored(served.store.write(lambda tx: queue.retry_waiting(tx, now)))
    served.on_commit.committed(done.wakes)
    log.info("console queue retry all remote=%s items=%s", request.remote, len(done.ids))
    count = len(done.ids)
    session.flash = f"{count} waiting item{'s' if count != 1 else ''} due now."
    return see_other(ROOT + "outbox")


async def _change(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    what = request.match_info["what"]
    job = queue.retry if what == "retry" else queue.drop
    item_id, rt, now = int(request.match_info["id"]), served.rt, served.clock.now()
    try:
        done = await stored(served.store.write(lambda tx: job(rt, tx, item_id, now)))
    except queue.QueueError as exc:
        return _refused(exc.status, exc.code, exc.detail, session)
    served.on_commit.committed(done.wakes)
    state = queue_items.item_json(done.row)["state"]
    log.info("console queue %s id=%s remote=%s state=%s", what, item_id, request.remote, state)
    verb = "retried: due now" if what == "retry" else "dropped"
    session.flash = f"Item {item_id} {verb} (now {state})."
    return see_other(ROOT + "outbox")


# ----------------------------------------------------------------------------- the live feed


async def _events(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    """The event feed after ``after`` (or ``Last-Event-ID``), of one case with ``case``, as
    Server-Sent Events carrying each event's timeline row; it ends when the session does."""
    text = request.headers.get(hdrs.LAST_EVENT_ID) or request.query.get("after") or feed.START
    after = feed.parse_cursor(text)
    if after is None:
        raise HttpRefusal(
            "invalid-message", f"after: {text[:40]!r} is not a cursor of the event feed"
        )
    case_key = None
    if request.query.get("case"):
        named = request.query["case"]
        keys = await stored(served.store.read(lambda tx: readside.keys_named(tx, named)))
        if len(keys) != 1:
            raise HttpRefusal("unknown-case", f"case: no one case {named}")
        case_key = keys[0]
    response = web.StreamResponse(
        headers={hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    if request.method == hdrs.METH_HEAD:
        return response
    token = request.cookies.get(COOKIE)
    try:
        pages_ = feed.stream(
            served.store, served.feed, after, case_key=case_key, idle=KEEPALIVE_SECONDS
        )
        async for found in pages_:
            live = served.sessions.find(token, _secret(served), served.clock.now(), touch=False)
            if live is None:
                break  # signed out, expired, or the secret changed
            mails = {}
            if case_key is not None and found.events:  # a case's page shows each mail
                entries = [e["entry"] for e in found.events]
                job = functools.partial(console_case.mails, entries=entries)
                mails = await served.store.read(job)
            await response.write(relayed(found, mails))
    except (ConnectionError, StoreError) as exc:
        log.info("console feed ended remote=%s: %s", request.remote, exc)
    return response


def relayed(found: feed.Page, mails: Mapping[str, Mapping[str, Any]] | None = None) -> bytes:
    """A page of the feed as the console's events: ``id`` the cursor, ``data`` the case
    and the entry's timeline row (with its mail, from ``mails`` by ``message_ref``); a
    comment when the page is empty (a keep-alive)."""
    if not found.events:
        return b": keep-alive\n\n"
    parts = []
    for event in found.events:
        entry = event["entry"]
        shown = row(entry, (mails or {}).get(str(entry.get("message_ref"))))
        data = {"cursor": event["cursor"], "case": event["case"], "row": shown}
        parts.append(f"id: {event['cursor']}\ndata: {_json(data)}\n\n")
    return "".join(parts).encode("utf-8")


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


ROUTES: Final = (
    Route("GET", CONSOLE_PATH, to_cases, "console"),
    Route("GET", ROOT, to_cases, "console"),
    Route("GET", ROOT + "sign-in", sign_in_page, "console"),
    Route("POST", ROOT + "sign-in", sign_in, "console"),
    Route("POST", ROOT + "sign-out", signed_in(_sign_out, change=True), "console"),
    Route("GET", ROOT + "static/{name}", static, "console"),
    Route("GET", ROOT + "cases", signed_in(_cases), "console"),
    Route("GET", ROOT + "cases/{key}", signed_in(_case), "console"),
    Route("GET", ROOT + "outbox", signed_in(_outbox), "console"),
    Route("POST", ROOT + "outbox/retry", signed_in(_retry_waiting, change=True), "console"),
    Route(
        "POST",
        ROOT + r"outbox/{id:\d{1,18}}/{what:retry|drop}",
        signed_in(_change, change=True),
        "console",
    ),
    Route("GET", ROOT + "intakes", signed_in(_intakes), "console"),
    Route("GET", ROOT + "suppressions", signed_in(_suppressions), "console"),
    Route("GET", ROOT + "health", signed_in(_health), "console"),
    Route("GET", ROOT + "events", signed_in(_events), "console"),
    Route("GET", ROOT + "messages/{ref}/raw", signed_in(console_mail.raw), "console"),
    Route(
        "GET",
        ROOT + "messages/{ref}/attachments/{n}",
        signed_in(console_mail.attachment),
        "console",
    ),
)
