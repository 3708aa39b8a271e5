"""What every route of the HTTP listener shares: its paths, the reply table, refusals, query
parameters, and the table a route declares itself in (docs/protocol.md §9, §16).

A route module holds its handlers and a :class:`Route` for each; :mod:`masd.edges.http.edge`
puts them on the application.  Nothing here imports a route.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, TypeVar

from aiohttp import hdrs, web

from masd.clock import Clock
from masd.console.sessions import Sessions
from masd.core.errors import Answer
from masd.edges.context import EdgeContext
from masd.metrics import Metrics
from masd.read.feed import FeedWatch
from masd.read.feed_hub import FeedHub
from masd.service import CommitListener, Runtime
from masd.store import StoreError, StoreHandle

T = TypeVar("T")

# ------------------------------------------------------------------ paths

MESSAGES_PATH: Final = "/mas/v0.1/messages"
MESSAGE_PATH: Final = MESSAGES_PATH + "/{ref}"
RAW_PATH: Final = MESSAGE_PATH + "/raw"
ATTACHMENT_PATH: Final = MESSAGE_PATH + "/attachments/{n}"
INTAKES_PATH: Final = "/mas/v0.1/intakes"
RESEND_PATH: Final = INTAKES_PATH + "/{ref}/resend"
CASES_PATH: Final = "/mas/v0.1/cases"
CASE_PATH: Final = CASES_PATH + "/{key}"
THREAD_PATH: Final = CASE_PATH + "/thread"
EVENTS_PATH: Final = "/mas/v0.1/events"
OUTBOX_PATH: Final = "/mas/v0.1/admin/outbox"
#: The test clock (masd serve --test-clock only).
CLOCK_PATH: Final = "/mas/v0.1/test/clock"
HEALTHZ_PATH: Final = "/healthz"
#: The operator console (``server.console``), its pages under this prefix.
CONSOLE_PATH: Final = "/console"
METRICS_PATH: Final = "/metrics"
#: The OpenAPI description of this listener.
OPENAPI_PATH: Final = "/openapi.json"

# ------------------------------------------------------------------ limits

#: docs/protocol.md §9: "413 too-large (body over 256 KiB)".
MAX_BODY: Final = 256 * 1024
#: docs/protocol.md §9.6: the bytes of one request header field (name and value) at most.
MAX_HEADER_FIELD: Final = 8190
#: Seconds a client should wait before sending again after a 503.
RETRY_AFTER: Final = 5

# ------------------------------------------------------------------ replies

#: The status of each kind of answer: the one table of them.  The core and the service
#: name an answer by its kind (:data:`masd.core.errors.Answer`); so does this edge for
#: the refusals it gives itself.
REPLIES: Final[Mapping[str, int]] = MappingProxyType(
    {
        # contract answers (masd.core.errors.Answer)
        "ok": 200,
        "refused": 422,  # mail.send under Principle 10
        "invalid-message": 400,  # also the read side's bad query parameter
        "unsupported-version": 400,
        "unknown-type": 400,
        "forbidden": 403,
        "unknown-case": 404,  # also the read side
        "unknown-handoff": 404,
        "unknown-intake": 404,
        "unknown-message": 404,  # also the read side: no such message or attachment
        "invalid-transition": 409,
        "already-assigned": 409,
        # this edge's own
        "unauthenticated": 401,
        "unsupported-media-type": 415,
        "too-large": 413,
        "unknown-item": 404,  # the outbound queue (masd.service.queue_actions)
        "wrong-state": 409,  # the outbound queue: an item already sent or withdrawn; an
        # intake already assigned
        "range-not-satisfiable": 416,  # a Range past the end of the bytes asked for
        "not-found": 404,
        "method-not-allowed": 405,
        "expectation-failed": 417,
        "unavailable": 503,
        "store": 503,  # /healthz: the store does not accept a write
    }
)


def status_of(kind: Answer) -> int:
    """The status a contract answer of this kind is given (:data:`REPLIES`)."""
    return REPLIES[kind]


class HttpRefusal(Exception):
    """A request refused: ``kind`` names the refusal (:data:`REPLIES` gives its status),
    ``detail`` says what was refused and why.

    Handlers and the authentication middleware raise it; the error middleware
    (:mod:`masd.edges.http.edge`) answers it with :meth:`response`, the one place a
    refusal becomes ``{"ok": false, "error": kind, "detail": ...}``.  ``status`` is
    given only for a status aiohttp itself chose; ``headers`` are added to the answer.
    """

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.status = status or REPLIES[kind]
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        """The JSON answer, with ``WWW-Authenticate`` on a 401 and ``Retry-After`` on a 503."""
        body = {"ok": False, "error": self.kind, "detail": self.detail}
        response = web.json_response(body, status=self.status, headers=self.headers)
        if self.kind == "unauthenticated":
            response.headers[hdrs.WWW_AUTHENTICATE] = 'Bearer realm="masd"'
        elif self.status == 503:
            response.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER)
        return response


async def stored(job: Awaitable[T]) -> T:
    """What a store job returned; a store that fails is ``503 unavailable``."""
    try:
        return await job
    except StoreError as exc:
        raise HttpRefusal("unavailable", f"store: {exc.detail}") from exc


# ------------------------------------------------------------------ secrets

#: ``Authorization: Bearer <secret>``; a secret is printable ASCII without
#: spaces (what check-config allows in a token file).
_BEARER: Final = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([!-~]+)")
NO_BEARER: Final = "Authorization: no Bearer secret of printable ASCII"


def bearer(request: web.Request) -> str | None:
    """The secret of ``Authorization: Bearer <secret>``; None when the header is
    missing or is not that (another scheme, a secret that is not printable ASCII)."""
    match = _BEARER.fullmatch(request.headers.get(hdrs.AUTHORIZATION, "").strip())
    return match.group(1) if match else None


def oversized_header(request: web.Request) -> HttpRefusal | None:
    """``400 invalid-message`` naming the first header field over :data:`MAX_HEADER_FIELD`
    (never its value); None when there is none."""
    for name, value in request.raw_headers:
        if len(name) + len(value) > MAX_HEADER_FIELD:
            shown = name[:60].decode("ascii", "replace")
            return HttpRefusal(
                "invalid-message",
                f"{shown}: a header field of {len(name) + len(value)} bytes, "
                f"over {MAX_HEADER_FIELD}",
            )
    return None


# ------------------------------------------------------------------ query parameters


def show(text: str | None) -> str:
    """``text`` quoted, cut at 40 characters, for a refusal's detail."""
    text = text or ""
    return '"' + (text if len(text) <= 40 else text[:40] + "…") + '"'


def bad(name: str, why: str) -> HttpRefusal:
    """``400 invalid-message`` naming the parameter."""
    return HttpRefusal("invalid-message", f"{name}: {why}")


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name`` (``default`` when absent); any other text is
    refused naming the parameter."""
    text = request.query.get(name)
    if text is None:
        return default
    # The length is checked before the conversion: int() refuses (or takes long over)
    # thousands of digits.
    digits = text.lstrip("0") or "0"
    ok = text.isascii() and text.isdigit() and len(digits) <= len(str(high))
    if not ok or not low <= int(digits) <= high:
        raise bad(name, f"{show(text)} is not an integer from {low} to {high}")
    return int(digits)


# ------------------------------------------------------------------ routes


@dataclass(frozen=True)
class Served:
    """What the routes work with: the edge's runtime, store, clock, counters, the
    listener told of each commit, the event feed's watch and its hub, and who is signed
    in to the console."""

    rt: Runtime
    store: StoreHandle
    clock: Clock
    metrics: Metrics
    on_commit: CommitListener
    feed: FeedWatch
    hub: FeedHub
    sessions: Sessions = field(default_factory=Sessions)

    @classmethod
    def of(cls, ctx: EdgeContext, feed: FeedWatch) -> Served:
        hub = FeedHub(ctx.store, feed)
        return cls(ctx.rt, ctx.store, ctx.clock, ctx.metrics, ctx.listener, feed, hub)


#: A route's handler: the request, and what it works with.
Handler = Callable[[web.Request, Served], Awaitable[web.StreamResponse]]
#: An ``Expect:`` handler (aiohttp's), run before the handler and its middleware.
Expect = Callable[[web.Request, Served], Awaitable[web.StreamResponse | None]]
#: Who may use a route: a peer's secret, the admin secret, a reader of the read side
#: (the admin, or a master for its own types: :mod:`masd.read.access`), anyone, or the
#: console's (served while ``server.console`` is on; its module checks the session cookie).
Auth = Literal["peer", "admin", "reader", "anyone", "console"]


@dataclass(frozen=True)
class Route:
    """One method on one path, its handler and who may use it.

    ``counted``: each answer counts in ``masd_http_requests_total`` by status.
    """

    method: str
    path: str
    handler: Handler
    auth: Auth
    counted: bool = False
    expect: Expect | None = None
