"""Who is asking: the middleware that checks the secret a route needs, once, before its
handler runs (docs/protocol.md §9.2, §16).

A :class:`~masd.edges.http.shared.Route` declares ``auth``: ``"peer"`` (a peer's Bearer
secret; the handler finds the peer as ``request[PRINCIPAL]``), ``"admin"`` (the admin
secret), ``"reader"`` (the read side: the admin secret, or a master's own; the handler
finds who as ``request[READER]`` and asks :func:`may_read` of each thing it shows) or
``"anyone"``, or ``"console"`` (the operator console: ``404 not-found`` while
``server.console`` is off; its pages check their session cookie themselves, in
:mod:`masd.edges.http.console`, since a browser is sent to the sign-in page rather than
answered 401).  A missing or unknown secret is ``401 unauthenticated``, raised as
:class:`~masd.edges.http.shared.HttpRefusal` before the body is read; a known secret on a
route it may not use (a peer's on an admin route, a mode endpoint's on the read side) is
``403 forbidden``; a thing a reader may not read (:func:`masd.read.access.entitled`, the
one rule of who reads what) is answered as a thing that does not exist (:func:`may_read`).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from masd.edges.http.shared import NO_BEARER, HttpRefusal, Route, bearer
from masd.logs import shown
from masd.read.access import ADMIN, ANYTHING, Owned, Reader, entitled
from masd.service import Runtime
from masd.service.peer_directory import Principal

log = logging.getLogger("masd.http")

#: The peer a ``"peer"`` route's secret authenticated.
PRINCIPAL: Final = web.RequestKey("principal", Principal)
#: Who a ``"reader"`` route's secret says reads.
READER: Final = web.RequestKey("reader", Reader)


def peer(rt: Runtime, request: web.Request) -> Principal:
    """The peer whose Bearer secret the request carries."""
    return peer_of(rt, bearer(request))


def peer_of(rt: Runtime, secret: str | None) -> Principal:
    """The peer whose secret ``secret`` is (None: no secret given)."""
    if secret is None:
        raise HttpRefusal("unauthenticated", NO_BEARER)
    principal = rt.directory.authenticate(secret)
    if principal is None:
        raise HttpRefusal("unauthenticated", "Authorization: the secret matches no peer")
    return principal


def admin(rt: Runtime, request: web.Request) -> None:
    """docs/protocol.md §16: an admin route needs the admin secret; a peer's secret is
    ``403 forbidden``, none or an unknown one 401."""
    token = rt.config.server.admin_token
    secret = bearer(request)
    if secret is None:
        raise HttpRefusal("unauthenticated", NO_BEARER)
    if token is not None and hmac.compare_digest(secret.encode(), token.encode()):
        return
    principal = rt.directory.authenticate(secret)
    if principal is not None:
        raise HttpRefusal(
            "forbidden", f"Authorization: a {principal.kind} peer's secret, not the admin secret"
        )
    if token is None:
        raise HttpRefusal(
            "unauthenticated",
            "no admin token is configured (server.admin_token_file): the admin routes are closed",
        )
    raise HttpRefusal("unauthenticated", "Authorization: not the admin secret")


def reader(rt: Runtime, request: web.Request) -> Reader:
    """Who reads: the admin, or the master a peer's secret names; a mode endpoint or a
    webhook is ``403 forbidden`` (it reads nothing), any other secret ``401``."""
    return reader_of(rt, bearer(request))


def reader_of(rt: Runtime, secret: str | None) -> Reader:
    """:func:`reader` for the secret ``secret`` (None: no secret given)."""
    if secret is None:
        raise HttpRefusal("unauthenticated", NO_BEARER)
    token = rt.config.server.admin_token
    if token is not None and hmac.compare_digest(secret.encode(), token.encode()):
        return ADMIN
    principal = rt.directory.authenticate(secret)
    if principal is None:
        closed = " (and no admin token is configured: server.admin_token_file)"
        raise HttpRefusal(
            "unauthenticated",
            "Authorization: the secret matches no peer" + ("" if token else closed),
        )
    found = (
        Reader.master_of(principal.id, ((p.domain, p.type) for p in principal.peers))
        if principal.kind == "master"
        else None
    )
    if found is None or not entitled(found, ANYTHING):  # entitled(None, ...) is never true
        raise HttpRefusal(
            "forbidden", f"Authorization: a {principal.kind} peer's secret reads nothing here"
        )
    return found


def may_read(request: web.Request, what: Owned, missing: HttpRefusal) -> None:
    """Raise ``missing`` (the route's own refusal of a thing that does not exist) unless
    the request's reader may read ``what``: what a reader may not see is, to it, not there."""
    may_read_as(request[READER], what, missing)


def may_read_as(who: Reader, what: Owned, missing: HttpRefusal) -> None:
    """:func:`may_read` for the reader ``who``."""
    if not entitled(who, what):
        raise missing


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
        elif need == "reader":
            request[READER] = reader(rt, request)
        elif need == "peer":
            try:
                request[PRINCIPAL] = peer(rt, request)
            except HttpRefusal as exc:
                log.info("message refused remote=%s status=%d", shown(request.remote), exc.status)
                raise
        return await handler(request)

    return authenticated
