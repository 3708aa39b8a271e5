"""The HTTP routes an operator or an integrator watches and steers masd by (docs/protocol.md §16).

All need the admin secret (:meth:`masd.edges.http.HttpEdge.admin_refusal`):

- ``GET /mas/v0.1/cases``: the case list (:func:`masd.read.case_views.cases_json`);
- ``GET /mas/v0.1/events``: the event feed (:mod:`masd.read.feed`), as JSON with an
  optional long poll (``wait``), or as Server-Sent Events when the client
  accepts ``text/event-stream`` (resuming from ``Last-Event-ID``);
- ``GET /mas/v0.1/admin/outbox`` and ``POST .../retry``, ``.../{id}/retry``,
  ``.../{id}/drop``: the outbound queue (:mod:`masd.read.queue_items`,
  :mod:`masd.service.queue_actions`).  Each change is
  one store job; once it has committed the outbox is woken, so a retried
  item goes out now.

A stream ends when masd stops (:meth:`ReadRoutes.closing`); the client
resumes from the last ``id`` it saw.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final

from aiohttp import hdrs, web

from masd.edges.http import HttpEdge, int_param, refusal
from masd.read import case_views as readside
from masd.read import feed, queue_items
from masd.service import Runtime
from masd.service import queue_actions as queue
from masd.store import StoreError, Tx

log = logging.getLogger("masd.http")

CASES_PATH: Final = "/mas/v0.1/cases"
EVENTS_PATH: Final = "/mas/v0.1/events"
OUTBOX_PATH: Final = "/mas/v0.1/admin/outbox"
#: Seconds of silence after which a stream sends a keep-alive comment.
KEEPALIVE_SECONDS: Final = 15.0
#: The longest participant or domain a filter takes.
MAX_FILTER: Final = 320
SSE_HEADERS: Final = {
    hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8",
    hdrs.CACHE_CONTROL: "no-cache",
    "X-Accel-Buffering": "no",  # a proxy in front must not hold events back
}

#: A change to one queue item (:mod:`masd.service.queue_actions`: ``retry``, ``drop``).
Change = Callable[[Runtime, Tx, int, float], queue.Done]


class ReadRoutes:
    """The handlers; :meth:`add` puts them on an application."""

    def __init__(self, edge: HttpEdge, watch: feed.FeedWatch) -> None:
        self.edge = edge
        self.watch = watch

    def add(self, app: web.Application) -> None:
        app.router.add_get(CASES_PATH, self.cases)
        app.router.add_get(EVENTS_PATH, self.events)
        app.router.add_get(OUTBOX_PATH, self.outbox)
        app.router.add_post(OUTBOX_PATH + "/retry", self.retry_waiting)
        app.router.add_post(OUTBOX_PATH + r"/{id:\d{1,18}}/retry", self.retry)
        app.router.add_post(OUTBOX_PATH + r"/{id:\d{1,18}}/drop", self.drop)
        app.on_shutdown.append(self.closing)

    async def closing(self, app: web.Application) -> None:
        """masd is stopping: long polls answer and streams end now."""
        del app
        self.watch.close()

    # ------------------------------------------------------------------ the case list

    async def cases(self, request: web.Request) -> web.StreamResponse:
        if (denied := self.edge.admin_refusal(request)) is not None:
            return denied
        q = request.query
        after = None if "after" not in q else readside.parse_case_cursor(q["after"])
        if "after" in q and after is None:
            return _bad("after", f"{_show(q['after'])} is not a cursor of the case list")
        limit = _int(request, "limit", readside.DEFAULT_CASES, 1, readside.MAX_LIMIT)
        if isinstance(limit, web.Response):
            return limit
        state = q.get("state")
        if state is not None and state not in readside.CASE_STATES:
            return _bad("state", f"{_show(state)} is not open or closed")
        for name in ("participant", "domain"):
            if len(q.get(name, "")) > MAX_FILTER:
                return _bad(name, f"longer than {MAX_FILTER} characters")
        where = readside.CaseFilter(state, q.get("participant"), q.get("domain"))
        return await self._read(lambda tx: readside.cases_json(tx, after, limit, where))

    # ------------------------------------------------------------------ the event feed

    async def events(self, request: web.Request) -> web.StreamResponse:
        if (denied := self.edge.admin_refusal(request)) is not None:
            return denied
        streaming = "text/event-stream" in request.headers.get(hdrs.ACCEPT, "")
        text = request.query.get("after")
        if streaming and hdrs.LAST_EVENT_ID in request.headers:
            text = request.headers[hdrs.LAST_EVENT_ID]  # a reconnecting client resumes there
        after = 0 if text is None else feed.parse_cursor(text)
        if after is None:
            return _bad("after", f"{_show(text)} is not a cursor of the event feed")
        limit = _int(request, "limit", feed.DEFAULT_EVENTS, 1, feed.MAX_EVENTS)
        wait = _int(request, "wait", 0, 0, feed.MAX_WAIT)
        if isinstance(limit, web.Response):
            return limit
        if isinstance(wait, web.Response):
            return wait
        case_key = await self._case_key(request.query.get("case"))
        if isinstance(case_key, web.Response):
            return case_key
        try:
            first = await self.edge.store.read(
                functools.partial(feed.page, after=after, limit=limit, case_key=case_key)
            )
            if not first.events and not first.ahead and wait > 0 and not streaming:
                first = await feed.follow(
                    self.edge.store, self.watch, after, limit=limit, case_key=case_key, wait=wait
                )
        except StoreError as exc:
            return _unavailable(exc)
        if first.ahead:
            return _bad(
                "after",
                f"{text} is past the latest event of this store (was it restored from a "
                "backup?); start again without after",
            )
        if not streaming:
            return web.json_response(first.json())
        return await self._stream(request, first, case_key)

    async def _case_key(self, text: str | None) -> str | web.Response | None:
        """The key of the case ``case=`` names (address, key or an id only one case has)."""
        if text is None:
            return None
        try:
            keys = await self.edge.store.read(lambda tx: readside.keys_named(tx, text))
        except StoreError as exc:
            return _unavailable(exc)
        if len(keys) > 1:
            return _bad("case", f"{_show(text)} is the id of {len(keys)} cases; give the address")
        return keys[0] if keys else refusal("unknown-case", f"case: no case {text}")

    async def _stream(
        self, request: web.Request, first: feed.Page, case_key: str | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        after = feed.parse_cursor(first.next) or 0
        log.info("feed stream remote=%s after=%s case=%s", request.remote, first.next, case_key)
        try:
            if first.events:
                await response.write(feed.sse(first))
            pages = feed.stream(
                self.edge.store,
                self.watch,
                after,
                case_key=case_key,
                idle=KEEPALIVE_SECONDS,
            )
            async for found in pages:
                await response.write(feed.sse(found))
        except (ConnectionError, StoreError) as exc:  # the client left, or the store failed
            log.info("feed stream ended remote=%s: %s", request.remote, exc)
        return response

    # ------------------------------------------------------------------ the outbound queue

    async def outbox(self, request: web.Request) -> web.StreamResponse:
        if (denied := self.edge.admin_refusal(request)) is not None:
            return denied
        limit = _int(request, "limit", queue_items.DEFAULT_ITEMS, 1, queue_items.MAX_ITEMS)
        if isinstance(limit, web.Response):
            return limit
        return await self._read(lambda tx: queue_items.listing(tx, limit))

    async def retry_waiting(self, request: web.Request) -> web.StreamResponse:
        if (denied := self.edge.admin_refusal(request)) is not None:
            return denied
        now = self.edge.clock.now()
        try:
            done = await self.edge.store.write(lambda tx: queue.retry_waiting(tx, now))
        except StoreError as exc:
            return _unavailable(exc)
        self.edge.on_commit.committed(done.wakes)
        log.info("queue retry all remote=%s items=%s", request.remote, len(done.ids))
        return web.json_response({"ok": True, "retried": done.ids})

    async def retry(self, request: web.Request) -> web.StreamResponse:
        return await self._change(request, "retry", queue.retry)

    async def drop(self, request: web.Request) -> web.StreamResponse:
        return await self._change(request, "drop", queue.drop)

    async def _change(self, request: web.Request, what: str, job: Change) -> web.StreamResponse:
        if (denied := self.edge.admin_refusal(request)) is not None:
            return denied
        item_id, rt, now = int(request.match_info["id"]), self.edge.rt, self.edge.clock.now()
        try:
            done = await self.edge.store.write(lambda tx: job(rt, tx, item_id, now))
        except queue.QueueError as exc:
            return refusal(exc.code, exc.detail, status=exc.status)
        except StoreError as exc:
            return _unavailable(exc)
        self.edge.on_commit.committed(done.wakes)
        item = queue_items.item_json(done.row)
        log.info("queue %s id=%s remote=%s state=%s", what, item_id, request.remote, item["state"])
        return web.json_response({"ok": True, "item": item})

    # ------------------------------------------------------------------ plumbing

    async def _read(self, job: Callable[[Tx], Any]) -> web.StreamResponse:
        try:
            return web.json_response(await self.edge.store.read(job))
        except StoreError as exc:
            return _unavailable(exc)


def _show(text: str | None) -> str:
    text = text or ""
    return '"' + (text if len(text) <= 40 else text[:40] + "…") + '"'


def _bad(name: str, why: str) -> web.Response:
    return refusal("invalid-message", f"{name}: {why}")


def _unavailable(exc: StoreError) -> web.Response:
    return refusal("unavailable", f"store: {exc.detail}")


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int | web.Response:
    value = int_param(request, name, default, low, high)
    return _bad(name, value) if isinstance(value, str) else value
