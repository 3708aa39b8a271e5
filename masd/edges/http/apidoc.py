"""``GET /openapi.json``: the OpenAPI description of this listener (:mod:`masd.edges.http.openapi`),
the same bytes as ``docs/openapi.json`` in the source."""

from __future__ import annotations

import functools
from typing import Final

from aiohttp import web

from masd.edges.http.openapi import rendered
from masd.edges.http.shared import OPENAPI_PATH, Route, Served


@functools.cache
def _document() -> bytes:
    return rendered()


async def openapi(request: web.Request, edge: Served) -> web.StreamResponse:
    del request, edge
    return web.Response(body=_document(), content_type="application/json", charset="utf-8")


ROUTES: Final = (Route("GET", OPENAPI_PATH, openapi, "anyone"),)
