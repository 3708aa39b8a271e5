"""``GET /healthz`` (docs/protocol.md §9): 200 only while the store accepts a write."""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web

from masd.edges.http.shared import HEALTHZ_PATH, HttpRefusal, Route, Served

log = logging.getLogger("masd.http")


async def healthz(request: web.Request, edge: Served) -> web.StreamResponse:
    """The store's health, checked at most every 5 s."""
    try:
        health = await edge.store.check()
    except Exception as exc:  # any failure means "not healthy"
        log.warning("healthz store unavailable: %s", exc)
        raise HttpRefusal("store", "the store does not answer (see the log)") from exc
    if not health.writable:
        raise HttpRefusal("store", health.describe())
    return web.json_response({"ok": True})


ROUTES: Final = (Route("GET", HEALTHZ_PATH, healthz, "anyone"),)
