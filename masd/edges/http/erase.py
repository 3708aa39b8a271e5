"""``POST /mas/v0.1/cases/{key}/erase``: remove one case (docs/protocol.md §16.11,
:mod:`masd.service.erase`), admin only.

One store job; once it has committed the outbox is woken, so the
``handoff.cancel`` to the case's mode goes out now, and the feed's hub lets
go of the case's events it holds (no follower is handed them from memory).
"""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web

from masd.edges.http.shared import CASE_PATH, HttpRefusal, Route, Served, stored
from masd.logs import shown
from masd.service import erase as erasing

log = logging.getLogger("masd.http")

ERASE_PATH: Final = CASE_PATH + "/erase"


async def erase(request: web.Request, edge: Served) -> web.StreamResponse:
    key, rt, now = request.match_info["key"], edge.rt, edge.clock.now()
    try:
        done = await stored(edge.store.write(lambda tx: erasing.erase(rt, tx, key, now)))
    except erasing.UnknownCase as exc:
        raise HttpRefusal("unknown-case", exc.detail) from exc
    edge.on_commit.committed(done.wakes)
    edge.hub.forget(key, done.pos)
    log.info(
        "case erased case=%s remote=%s %s",
        key,
        shown(request.remote),
        " ".join(f"{table}={n}" for table, n in done.counts.items()),
        extra={"case": key},
    )
    return web.json_response({"ok": True, "erased": done.counts})


ROUTES: Final = (Route("POST", ERASE_PATH, erase, "admin"),)
