"""``GET /mas/v0.1/events``: the event feed (docs/protocol.md §16.5, :mod:`masd.read.feed`).

As JSON with an optional long poll (``wait``), or as Server-Sent Events when
the client accepts ``text/event-stream`` (resuming from ``Last-Event-ID``).
A stream ends when masd stops (the edge closes the feed's watch); the client
resumes from the last ``id`` it saw.
"""

from __future__ import annotations

import functools
import logging
from typing import Final

from aiohttp import hdrs, web

from masd.edges.http.auth import READER, may_read
from masd.edges.http.shared import (
    EVENTS_PATH,
    HttpRefusal,
    Route,
    Served,
    bad,
    int_param,
    show,
    stored,
)
from masd.read import case_views as readside
from masd.read import feed
from masd.read.access import Owned
from masd.store import StoreError

log = logging.getLogger("masd.http")

#: Seconds of silence after which a stream sends a keep-alive comment.
KEEPALIVE_SECONDS: Final = 15.0
SSE_HEADERS: Final = {
    hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8",
    hdrs.CACHE_CONTROL: "no-cache",
    "X-Accel-Buffering": "no",  # a proxy in front must not hold events back
}


async def events(request: web.Request, edge: Served) -> web.StreamResponse:
    streaming = "text/event-stream" in request.headers.get(hdrs.ACCEPT, "")
    text = request.query.get("after")
    if streaming and hdrs.LAST_EVENT_ID in request.headers:
        text = request.headers[hdrs.LAST_EVENT_ID]  # a reconnecting client resumes there
    after = 0 if text is None else feed.parse_cursor(text)
    if after is None:
        raise bad("after", f"{show(text)} is not a cursor of the event feed")
    limit = int_param(request, "limit", feed.DEFAULT_EVENTS, 1, feed.MAX_EVENTS)
    wait = int_param(request, "wait", 0, 0, feed.MAX_WAIT)
    case_key = await _case_key(request, edge, request.query.get("case"))
    scope = request[READER].scope
    first = await stored(
        edge.store.read(
            functools.partial(feed.page, after=after, limit=limit, case_key=case_key, scope=scope)
        )
    )
    if not first.events and not first.ahead and wait > 0 and not streaming:
        first = await stored(
            feed.follow(
                edge.store, edge.feed, after, limit=limit, case_key=case_key, wait=wait, scope=scope
            )
        )
    if first.ahead:
        raise bad(
            "after",
            f"{text} is past the latest event of this store (was it restored from a "
            "backup?); start again without after",
        )
    if not streaming:
        return web.json_response(first.json())
    return await _stream(request, edge, first, case_key)


async def _case_key(request: web.Request, edge: Served, text: str | None) -> str | None:
    """The key of the case ``case=`` names (address, key or an id only one case has),
    which the reader must be entitled to."""
    if text is None:
        return None
    keys = await stored(edge.store.read(lambda tx: readside.keys_named(tx, text)))
    if len(keys) > 1:
        raise bad("case", f"{show(text)} is the id of {len(keys)} cases; give the address")
    if not keys:
        raise HttpRefusal("unknown-case", f"case: no case {text}")
    found = await stored(edge.store.read(lambda tx: readside.case_json(tx, keys[0])))
    if found is not None:
        case = found["case"]
        may_read(request, Owned(case["domain"], case["type"]), f"case {case['key']}")
    return keys[0]


async def _stream(
    request: web.Request, edge: Served, first: feed.Page, case_key: str | None
) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    after = feed.parse_cursor(first.next) or 0
    log.info("feed stream remote=%s after=%s case=%s", request.remote, first.next, case_key)
    try:
        if first.events:
            await response.write(feed.sse(first))
        pages = feed.stream(
            edge.store,
            edge.feed,
            after,
            case_key=case_key,
            idle=KEEPALIVE_SECONDS,
            scope=request[READER].scope,
        )
        async for found in pages:
            await response.write(feed.sse(found))
    except (ConnectionError, StoreError) as exc:  # the client left, or the store failed
        log.info("feed stream ended remote=%s: %s", request.remote, exc)
    return response


ROUTES: Final = (Route("GET", EVENTS_PATH, events, "reader"),)
