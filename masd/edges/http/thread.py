"""``GET /mas/v0.1/cases/{key}/thread``: a case's thread, page by page (docs/protocol.md §16.2,
:func:`masd.readside.thread_json`)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd import readside
from masd.edges.http.shared import THREAD_PATH, Route, Served, admin_refusal, int_param, refusal
from masd.store import StoreError


async def thread(request: web.Request, edge: Served) -> web.StreamResponse:
    if (denied := admin_refusal(edge.rt, request)) is not None:
        return denied
    key = request.match_info["key"]
    after = int_param(request, "after", 0, 0, 2**63 - 1)
    limit = int_param(request, "limit", readside.DEFAULT_LIMIT, 1, readside.MAX_LIMIT)
    for name, value in (("after", after), ("limit", limit)):
        if isinstance(value, str):
            return refusal("invalid-message", f"{name}: {value}")
    assert isinstance(after, int)
    assert isinstance(limit, int)
    try:
        doc = await edge.store.read(lambda db: readside.thread_json(db, key, after, limit))
    except StoreError as exc:
        return refusal("unavailable", f"store: {exc.detail}")
    if doc is None:
        return refusal("unknown-case", f"key: no case {key}")
    return web.json_response(doc)


ROUTES: Final = (Route("GET", THREAD_PATH, thread, "admin"),)
