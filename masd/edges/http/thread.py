"""``GET /mas/v0.1/cases/{key}/thread``: a case's thread, page by page (docs/protocol.md §16.2,
:func:`masd.read.case_views.thread_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd.edges.http.auth import may_read
from masd.edges.http.shared import THREAD_PATH, HttpRefusal, Route, Served, int_param, stored
from masd.read import case_views as readside
from masd.read.access import Owned


async def thread(request: web.Request, edge: Served) -> web.StreamResponse:
    key = request.match_info["key"]
    after = int_param(request, "after", 0, 0, 2**63 - 1)
    limit = int_param(request, "limit", readside.DEFAULT_LIMIT, 1, readside.MAX_LIMIT)
    missing = HttpRefusal("unknown-case", f"key: no case {key}")
    found = await stored(edge.store.read(lambda db: readside.case_json(db, key)))
    if found is None:
        raise missing
    case = found["case"]
    may_read(request, Owned(case["domain"], case["type"]), missing)
    doc = await stored(edge.store.read(lambda db: readside.thread_json(db, key, after, limit)))
    if doc is None:
        raise missing
    return web.json_response(doc)


ROUTES: Final = (Route("GET", THREAD_PATH, thread, "reader"),)
