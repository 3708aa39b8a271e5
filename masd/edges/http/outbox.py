"""The outbound queue (docs/protocol.md §16, :mod:`masd.queue`): ``GET /mas/v0.1/admin/outbox``
and ``POST .../retry``, ``.../{id}/retry``, ``.../{id}/drop``.

Each change is one store job; once it has committed the outbox is woken, so a
retried item goes out now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from aiohttp import web

from masd import queue
from masd.edges.http.shared import (
    OUTBOX_PATH,
    Route,
    Served,
    admin_refusal,
    int_or_refusal,
    refusal,
)
from masd.service import Runtime
from masd.store import StoreError, Tx

log = logging.getLogger("masd.http")

#: A change to one queue item (:func:`masd.queue.retry`, :func:`masd.queue.drop`).
Change = Callable[[Runtime, Tx, int, float], queue.Done]


async def outbox(request: web.Request, edge: Served) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    limit = int_or_refusal(request, "limit", queue.DEFAULT_ITEMS, 1, queue.MAX_ITEMS)
    if isinstance(limit, web.Response):
        return limit
    try:
        return web.json_response(await edge.store.read(lambda tx: queue.listing(tx, limit)))
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")


async def retry_waiting(request: web.Request, edge: Served) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    now = edge.clock.now()
    try:
        done = await edge.store.write(lambda tx: queue.retry_waiting(tx, now))
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")
    edge.on_commit.committed(done.wakes)
    log.info("queue retry all remote=%s items=%s", request.remote, len(done.ids))
    return web.json_response({"ok": True, "retried": done.ids})


async def retry(request: web.Request, edge: Served) -> web.StreamResponse:
    return await _change(request, edge, "retry", queue.retry)


async def drop(request: web.Request, edge: Served) -> web.StreamResponse:
    return await _change(request, edge, "drop", queue.drop)


async def _change(request: web.Request, edge: Served, what: str, job: Change) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    item_id, rt, now = int(request.match_info["id"]), edge.rt, edge.clock.now()
    try:
        done = await edge.store.write(lambda tx: job(rt, tx, item_id, now))
    except queue.QueueError as exc:
        return refusal(exc.code, exc.detail, status=exc.status)
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")
    edge.on_commit.committed(done.wakes)
    log.info("queue %s id=%s remote=%s state=%s", what, item_id, request.remote, done.item["state"])
    return web.json_response({"ok": True, "item": done.item})


ROUTES: Final = (
    Route("GET", OUTBOX_PATH, outbox, "admin"),
    Route("POST", OUTBOX_PATH + "/retry", retry_waiting, "admin"),
    Route("POST", OUTBOX_PATH + r"/{id:\d{1,18}}/retry", retry, "admin"),
    Route("POST", OUTBOX_PATH + r"/{id:\d{1,18}}/drop", drop, "admin"),
)
