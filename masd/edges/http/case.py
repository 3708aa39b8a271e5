"""``GET /mas/v0.1/cases/{key}``: one case (docs/protocol.md §16.1,
:func:`masd.readside.case_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd import readside
from masd.edges.http.shared import CASE_PATH, Route, Served, admin_refusal, refusal
from masd.store import StoreError


async def case(request: web.Request, edge: Served) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    key = request.match_info["key"]
    try:
        doc = await edge.store.read(lambda db: readside.case_json(db, key))
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")
    if doc is None:
        return refusal("unknown-case", f"key: no case {key}")
    return web.json_response(doc)


ROUTES: Final = (Route("GET", CASE_PATH, case, "admin"),)
