"""``GET /metrics``: counters and gauges in the Prometheus text format (docs/protocol.md §9).

Gauges are read from the store at each scrape (they survive restarts);
:func:`masd.metrics.store_gauges` says what each one counts.
"""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import hdrs, web

from masd.edges.http.shared import METRICS_PATH, HttpRefusal, Route, Served
from masd.metrics import health_gauges, store_gauges
from masd.store import StoreError

log = logging.getLogger("masd.http")

METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: web.Request, edge: Served) -> web.StreamResponse:
    try:
        gauges = await edge.store.read(store_gauges)
        gauges.update(health_gauges(edge.store.health))
    except StoreError as exc:
        log.warning("metrics store unavailable: %s", exc)
        raise HttpRefusal("unavailable", "store: not answering (see the log)") from exc
    return web.Response(
        body=edge.metrics.render(gauges).encode(),
        headers={hdrs.CONTENT_TYPE: METRICS_CONTENT_TYPE},
    )


ROUTES: Final = (Route("GET", METRICS_PATH, metrics, "anyone"),)
