"""Who is asking: the middleware that checks the secret a route needs, once, before its
handler runs (docs/protocol.md §9.2, §16).

A :class:`~masd.edges.http.shared.Route` declares ``auth``: ``"peer"`` (a peer's Bearer
secret; the handler finds the peer as ``request[PRINCIPAL]``), ``"admin"`` (the admin
secret), ``"anyone"``, or ``"console"`` (the operator console: ``404 not-found`` while
``server.console`` is off; its pages check their session cookie themselves, in
:mod:`masd.edges.http.console`, since a browser is sent to the sign-in page rather than
answered 401).  A missing or wrong secret is ``401 unauthenticated``, raised as
:class:`~masd.edges.http.shared.HttpRefusal` before the body is read.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from masd.edges.http.shared import NO_BEARER, HttpRefusal, Route, bearer
from masd.service import Runtime
from masd.service.peer_directory import Principal

log = logging.getLogger("masd.http")

#: The peer a ``"peer"`` route's secret authenticated.
PRINCIPAL: Final = web.RequestKey("principal", Principal)


def peer(rt: Runtime, request: web.Request) -> Principal:
    """The peer whose Bearer secret the request carries."""
    secret = bearer(request)
    if secret is None:
        raise HttpRefusal("unauthenticated", NO_BEARER)
    principal = rt.directory.authenticate(secret)
    if principal is None:
        raise HttpRefusal("unauthenticated", "Authorization: the secret matches no peer")
    return principal


def admin(rt: Runtime, request: web.Request) -> None:
    """docs/protocol.md §16: the read side needs the admin secret, else 401."""
    token = rt.config.server.admin_token
    if token is None:
        raise HttpRefusal(
            "unauthenticated",
            "no admin token is configured (server.admin_token_file): the read side is closed",
        )
    secret = bearer(request)
    if secret is None:
        raise HttpRefusal("unauthenticated", NO_BEARER)
    if not hmac.compare_digest(secret.encode(), token.encode()):
        raise HttpRefusal("unauthenticated", "Authorization: not the admin secret")


def authenticate(rt: Runtime, routes: Mapping[web.AbstractRoute, Route]) -> Middleware:
    """The middleware: what the request's route (``routes``) needs, checked before its
    handler.  A path or method no route serves needs nothing (it is 404 or 405)."""

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = routes.get(request.match_info.route)
        need = "anyone" if route is None else route.auth
        if need == "admin":
            admin(rt, request)
        elif need == "console" and not rt.config.server.console:
            raise HttpRefusal("not-found", f"path: {request.path} is not served here")
        elif need == "peer":
            try:
                request[PRINCIPAL] = peer(rt, request)
            except HttpRefusal as exc:
                log.info("message refused remote=%s status=%d", request.remote, exc.status)
                raise
        return await handler(request)

    return authenticated
