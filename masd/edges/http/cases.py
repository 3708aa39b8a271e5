"""``GET /mas/v0.1/cases``: the case list (docs/protocol.md §16.4,
:func:`masd.readside.cases_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd import readside
from masd.edges.http.shared import (
    CASES_PATH,
    Route,
    Served,
    admin_refusal,
    bad,
    int_or_refusal,
    refusal,
    show,
)
from masd.store import StoreError

#: The longest participant or domain a filter takes.
MAX_FILTER: Final = 320


async def cases(request: web.Request, edge: Served) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    q = request.query
    after = None if "after" not in q else readside.parse_case_cursor(q["after"])
    if "after" in q and after is None:
        return bad("after", f"{show(q['after'])} is not a cursor of the case list")
    limit = int_or_refusal(request, "limit", readside.DEFAULT_CASES, 1, readside.MAX_LIMIT)
    if isinstance(limit, web.Response):
        return limit
    state = q.get("state")
    if state is not None and state not in readside.CASE_STATES:
        return bad("state", f"{show(state)} is not open or closed")
    for name in ("participant", "domain"):
        if len(q.get(name, "")) > MAX_FILTER:
            return bad(name, f"longer than {MAX_FILTER} characters")
    where = readside.CaseFilter(state, q.get("participant"), q.get("domain"))
    try:
        return web.json_response(
            await edge.store.read(lambda tx: readside.cases_json(tx, after, limit, where))
        )
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")


ROUTES: Final = (Route("GET", CASES_PATH, cases, "admin"),)
