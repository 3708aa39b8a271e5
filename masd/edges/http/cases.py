"""``GET /mas/v0.1/cases``: the case list (docs/protocol.md §16.4,
:func:`masd.read.case_views.cases_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd.edges.http.auth import READER
from masd.edges.http.shared import CASES_PATH, Route, Served, bad, int_param, show, stored
from masd.read import case_views as readside

#: The longest participant or domain a filter takes.
MAX_FILTER: Final = 320


async def cases(request: web.Request, edge: Served) -> web.StreamResponse:
    q = request.query
    after = None if "after" not in q else readside.parse_case_cursor(q["after"])
    if "after" in q and after is None:
        raise bad("after", f"{show(q['after'])} is not a cursor of the case list")
    limit = int_param(request, "limit", readside.DEFAULT_CASES, 1, readside.MAX_LIMIT)
    state = q.get("state")
    if state is not None and state not in readside.CASE_STATES:
        raise bad("state", f"{show(state)} is not open or closed")
    for name in ("participant", "domain"):
        if len(q.get(name, "")) > MAX_FILTER:
            raise bad(name, f"longer than {MAX_FILTER} characters")
    where = readside.CaseFilter(state, q.get("participant"), q.get("domain"))
    scope = request[READER].scope
    found = await stored(
        edge.store.read(lambda tx: readside.cases_json(tx, after, limit, where, scope))
    )
    return web.json_response(found)


ROUTES: Final = (Route("GET", CASES_PATH, cases, "reader"),)
