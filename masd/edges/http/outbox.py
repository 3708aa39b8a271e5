"""The outbound queue (docs/protocol.md §16, :mod:`masd.service.queue_actions`):
``GET /mas/v0.1/admin/outbox``
and ``POST .../retry``, ``.../{id}/retry``, ``.../{id}/drop``.

Each change is one store job; once it has committed the outbox is woken, so a
retried item goes out now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from aiohttp import web

from masd.edges.http.shared import OUTBOX_PATH, HttpRefusal, Route, Served, int_param, stored
from masd.logs import shown
from masd.read import queue_items
from masd.service import Runtime
from masd.service import queue_actions as queue
from masd.store import Tx

log = logging.getLogger("masd.http")

#: A change to one queue item (:mod:`masd.service.queue_actions`: ``retry``, ``drop``).
Change = Callable[[Runtime, Tx, int, float], queue.Done]


async def outbox(request: web.Request, edge: Served) -> web.StreamResponse:
    limit = int_param(request, "limit", queue_items.DEFAULT_ITEMS, 1, queue_items.MAX_ITEMS)
    return web.json_response(
        await stored(edge.store.read(lambda tx: queue_items.listing(tx, limit)))
    )


async def retry_waiting(request: web.Request, edge: Served) -> web.StreamResponse:
    now = edge.clock.now()
    done = await stored(edge.store.write(lambda tx: queue.retry_waiting(tx, now)))
    edge.on_commit.committed(done.wakes)
    log.info("queue retry all remote=%s items=%s", shown(request.remote), len(done.ids))
    return web.json_response({"ok": True, "retried": done.ids})


async def retry(request: web.Request, edge: Served) -> web.StreamResponse:
    return await _change(request, edge, "retry", queue.retry)


async def drop(request: web.Request, edge: Served) -> web.StreamResponse:
    return await _change(request, edge, "drop", queue.drop)


async def _change(request: web.Request, edge: Served, what: str, job: Change) -> web.StreamResponse:
    item_id, rt, now = int(request.match_info["id"]), edge.rt, edge.clock.now()
    try:
        done = await stored(edge.store.write(lambda tx: job(rt, tx, item_id, now)))
    except queue.QueueError as exc:
        raise HttpRefusal(exc.code, exc.detail) from exc
    edge.on_commit.committed(done.wakes)
    item = queue_items.item_json(done.row)
    log.info(
        "queue %s id=%s remote=%s state=%s", what, item_id, shown(request.remote), item["state"]
    )
    return web.json_response({"ok": True, "item": item})


ROUTES: Final = (
    Route("GET", OUTBOX_PATH, outbox, "admin"),
    Route("POST", OUTBOX_PATH + "/retry", retry_waiting, "admin"),
    Route("POST", OUTBOX_PATH + r"/{id:\d{1,18}}/retry", retry, "admin"),
    Route("POST", OUTBOX_PATH + r"/{id:\d{1,18}}/drop", drop, "admin"),
)
