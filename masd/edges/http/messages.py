"""``POST /mas/v0.1/messages``: contract messages in (docs/protocol.md §9).

The checks run in order and the first failure answers: 401 (the authentication middleware,
:mod:`masd.edges.http.auth`; the body is not read) -> 415 ->
413 -> envelope (400) -> 403 for a type the peer may not send -> one store job
(:func:`masd.service.receive`: idempotency, schema, 404, 403, stale, 409).
"""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from masd import service
from masd.clock import Clock
from masd.core import wire
from masd.core.errors import WireError
from masd.edges.http.auth import PRINCIPAL, peer
from masd.edges.http.shared import MAX_BODY, MESSAGES_PATH, HttpRefusal, Route, Served, status_of
from masd.edges.signature_check import check_signature
from masd.service.peer_directory import Principal
from masd.store import StoreError

log = logging.getLogger("masd.http")

_CHUNK: Final = 64 * 1024


def _envelope_refs(env: wire.Envelope) -> tuple[object, object]:
    case = env.body.get("case")
    key = case.get("key") if isinstance(case, dict) else None
    return key, env.body.get("handoff_id")


def _media(request: web.Request) -> None:
    """415 -> 413 by Content-Length: what can be decided before the body, once the peer is
    known (the authentication middleware checked its secret)."""
    if hdrs.CONTENT_TYPE not in request.headers:
        raise HttpRefusal("unsupported-media-type", "Content-Type: missing (application/json)")
    if request.content_type != "application/json":
        raise HttpRefusal(
            "unsupported-media-type",
            f"Content-Type: {request.content_type} is not application/json",
        )
    charset = request.charset
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise HttpRefusal("unsupported-media-type", f"Content-Type: charset {charset} is not utf-8")
    length = request.content_length
    if length is not None and length > MAX_BODY:
        raise HttpRefusal("too-large", f"Content-Length: {length} bytes, over {MAX_BODY}")


async def expect(request: web.Request, edge: Served) -> web.StreamResponse | None:
    """``Expect: 100-continue``: invite the body only if it would be read.

    aiohttp runs this before the middleware, so the one refusal it gives (417) is
    answered here; any other is left to the handler, which refuses without the body.
    """
    asked = request.headers.get(hdrs.EXPECT, "").lower()
    if request.version != HttpVersion11:
        return None
    if asked != "100-continue":
        return HttpRefusal("expectation-failed", f"Expect: {asked} is not 100-continue").response()
    try:
        peer(edge.rt, request)
        _media(request)
    except HttpRefusal:
        return None
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    return None


async def _read_body(request: web.Request) -> bytes | None:
    """The body, or None once it passes :data:`MAX_BODY` (chunked bodies too)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(_CHUNK):
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _envelope(request: web.Request, principal: Principal, clock: Clock) -> wire.Envelope:
    """The body, read, decoded and checked: the peer may send its type."""
    try:
        _media(request)
    except HttpRefusal as exc:
        log.info("message refused remote=%s status=%d", request.remote, exc.status)
        raise
    raw = await _read_body(request)
    if raw is None:
        log.info("message refused peer=%s status=413 too-large", principal.id)
        raise HttpRefusal("too-large", f"body: over {MAX_BODY} bytes")
    if unsigned := check_signature(principal, request.headers, raw, clock.now()):
        log.info("message refused peer=%s status=401 %s", principal.id, unsigned)
        raise HttpRefusal("unauthenticated", unsigned)
    try:
        env = wire.parse_envelope(raw)
        wire.check_may_send(principal.kind, env)
    except WireError as exc:
        refusal = HttpRefusal(exc.code, exc.detail)
        log.info(
            "message refused peer=%s status=%d error=%s", principal.id, refusal.status, exc.code
        )
        raise refusal from exc
    return env


async def messages(request: web.Request, edge: Served) -> web.StreamResponse:
    principal = request[PRINCIPAL]
    env = await _envelope(request, principal, edge.clock)
    key, handoff_id = _envelope_refs(env)
    now = edge.clock.now()
    try:
        got = await edge.store.write(
            lambda db: service.receive(edge.rt, db, principal, env, now, status_of)
        )
    except StoreError as exc:
        log.warning(
            "message unavailable peer=%s type=%s id=%s case=%s: %s",
            principal.id,
            env.type,
            env.id,
            key,
            exc.detail,
        )
        raise HttpRefusal("unavailable", f"store: {exc.detail}") from exc
    edge.on_commit.committed(got.wakes)
    # The one line for the message: it names the statuses it recorded.
    recorded = got.statuses
    if handoff_id is None and recorded:
        handoff_id = recorded[-1].handoff_id  # a case.assign that opened a handoff
    log.info(
        "message peer=%s type=%s id=%s case=%s handoff=%s status=%d recorded=%s error=%s",
        principal.id,
        env.type,
        env.id,
        key,
        handoff_id,
        got.status,
        ",".join(s.status for s in recorded) or "-",
        got.body.get("error", "-"),
        extra={"case": key},
    )
    return web.json_response(dict(got.body), status=got.status)


ROUTES: Final = (Route("POST", MESSAGES_PATH, messages, "peer", counted=True, expect=expect),)
