"""``GET /mas/v0.1/cases/{key}``: one case (docs/protocol.md §16.1,
:func:`masd.read.case_views.case_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd.edges.http.auth import may_read
from masd.edges.http.shared import CASE_PATH, HttpRefusal, Route, Served, stored
from masd.read import case_views as readside
from masd.read.access import Owned


async def case(request: web.Request, edge: Served) -> web.StreamResponse:
    key = request.match_info["key"]
    missing = HttpRefusal("unknown-case", f"key: no case {key}")
    doc = await stored(edge.store.read(lambda db: readside.case_json(db, key)))
    if doc is None:
        raise missing
    case = doc["case"]
    may_read(request, Owned(case["domain"], case["type"]), missing)
    return web.json_response(doc)


ROUTES: Final = (Route("GET", CASE_PATH, case, "reader"),)
