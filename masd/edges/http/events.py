"""``GET /mas/v0.1/events``: the event feed (docs/protocol.md §16.5, :mod:`masd.read.feed`).

As JSON with an optional long poll (``wait``), or as Server-Sent Events when
the client accepts ``text/event-stream`` (resuming from ``Last-Event-ID``).
A stream ends when masd stops (the edge closes the feed's watch); the client
resumes from the last ``id`` it saw.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Final

from aiohttp import hdrs, web

from masd.edges.http.auth import READER
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
from masd.logs import shown
from masd.read import case_views as readside
from masd.read import feed
from masd.read.access import Reader, entitled, key_owner
from masd.read.feed_hub import REPLAY_PAGE, Dropped, Follower, FollowersFull
from masd.store import StoreError

log = logging.getLogger("masd.http")

#: Seconds of silence after which a stream sends a keep-alive comment.
KEEPALIVE_SECONDS: Final = 15.0
KEEPALIVE: Final = b": keep-alive\n\n"
#: Seconds a write to a stream may wait for the client to read before it is left.
STALL_SECONDS: Final = 60.0
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
    case_key = await case_key_for(edge, request[READER], request.query.get("case"))
    follower = Follower(after, case_key, request[READER])
    if not streaming and wait == 0:  # no follower: one read, as a follower's catching up
        found = await stored(
            edge.store.read(
                functools.partial(
                    feed.encoded,
                    after=after,
                    limit=limit,
                    case_key=case_key,
                    scope=follower.reader.scope,
                )
            )
        )
        _not_ahead(found, text)
        return _json(feed.body(found.items, after))
    try:
        with edge.hub.joined(follower, edge.rt.config.server.max_followers):
            if streaming:
                return await _stream(request, edge, follower, text)
            return _json(await _poll(request, edge, follower, limit, wait))
    except FollowersFull as exc:
        raise HttpRefusal("unavailable", f"feed: {exc}; retry later") from exc


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def _not_ahead(found: feed.Encodings, text: str | None) -> None:
    if found.ahead:
        raise bad(
            "after",
            f"{text} is past the latest event of this store (was it restored from a "
            "backup?); start again without after",
        )


async def _poll(
    request: web.Request, edge: Served, follower: Follower, limit: int, wait: int
) -> bytes:
    """A long poll: the next events after the cursor, held up to ``wait`` seconds
    (less if the client leaves)."""
    text = request.query.get("after")
    after = follower.pos
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    first = True
    while True:
        found = await stored(edge.hub.catch_up(follower, limit, first=first))
        if found is not None:
            if first:
                _not_ahead(found, text)
            if found.items:
                return feed.body(found.items, after)
            follower.pos = found.upto
        first = False
        items: list[feed.Encoded] | None = []
        while items == [] and (left := until - loop.time()) > 0 and not _over(request, edge):
            items = await edge.hub.wait_items(follower, limit, loop.time() + min(left, 1.0))
        if items is not None:
            return feed.body(items, after)


async def case_key_for(edge: Served, who: Reader, text: str | None) -> str | None:
    """The key of the case ``case=`` names (address, key or an id only one case has)
    among those ``who`` may read: the others are not counted, nor named."""
    if text is None:
        return None
    named = await stored(edge.store.read(lambda tx: readside.keys_named(tx, text)))
    keys = [key for key in named if entitled(who, key_owner(key))]
    if len(keys) > 1:
        raise bad("case", f"{show(text)} is the id of {len(keys)} cases; give the address")
    if not keys:
        raise HttpRefusal("unknown-case", f"case: no case {text}")
    return keys[0]


async def _stream(
    request: web.Request, edge: Served, follower: Follower, text: str | None
) -> web.StreamResponse:
    """Server-Sent Events from the cursor on: pages of the store while the follower
    is further back than the hub's tail, then what the hub reads, until masd stops."""
    found = await stored(edge.hub.catch_up(follower, REPLAY_PAGE, first=True))
    if found is not None:
        _not_ahead(found, text)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    transport = request.transport
    if transport is not None:
        follower.on_drop = transport.abort
    log.info(
        "feed stream remote=%s after=%s case=%s",
        shown(request.remote),
        shown(text),
        shown(follower.case_key),
    )
    try:
        await _follow(edge, follower, response, found, lambda: _gone(request))
    except (ConnectionError, StoreError, TimeoutError, Dropped) as exc:
        # The client left or stopped reading, or the store failed: it resumes from its last id.
        log.info("feed stream ended remote=%s: %s", request.remote, exc or type(exc).__name__)
    return response


async def _follow(
    edge: Served,
    follower: Follower,
    response: web.StreamResponse,
    found: feed.Encodings | None,
    gone: Callable[[], bool],
) -> None:
    loop = asyncio.get_running_loop()
    quiet = loop.time()
    while not edge.feed.closed:
        if found is not None:  # further back than the tail: a page of the store
            if found.items:
                await _write(response, b"".join(i.sse for i in found.items))
            follower.pos = found.upto
            found = await stored(edge.hub.catch_up(follower, REPLAY_PAGE))
            continue
        follower.live = True
        data = await edge.hub.next_sse(follower, min(quiet + KEEPALIVE_SECONDS, loop.time() + 1))
        if data is None or gone():
            return  # masd stops, or the client left (its place is free at once)
        if data or loop.time() - quiet >= KEEPALIVE_SECONDS:
            await _write(response, data or KEEPALIVE)
            quiet = loop.time()


def _over(request: web.Request, edge: Served) -> bool:
    """The client left, or masd stops."""
    return edge.feed.closed or _gone(request)


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _write(response: web.StreamResponse, data: bytes) -> None:
    """Write and wait for the transport to drain; a client that takes nothing for
    :data:`STALL_SECONDS` is left."""
    async with asyncio.timeout(STALL_SECONDS):
        await response.write(data)


ROUTES: Final = (Route("GET", EVENTS_PATH, events, "reader"),)
