"""``GET /mas/v0.1/intakes``: slave-role intakes, pending or assigned, oldest first; and
``POST /mas/v0.1/intakes/{ref}/resend`` (admin): a pending intake's ``case.intake`` sent
again with a fresh id (docs/protocol.md §16.9, :mod:`masd.read.messages`,
:mod:`masd.service.intakes`)."""

from __future__ import annotations

import logging
from typing import Final

from aiohttp import web

from masd.edges.http.auth import READER
from masd.edges.http.shared import (
    INTAKES_PATH,
    RESEND_PATH,
    HttpRefusal,
    Route,
    Served,
    bad,
    int_param,
    show,
    stored,
)
from masd.read import messages as readside
from masd.service import intakes

log = logging.getLogger("masd.http")


async def intake_list(request: web.Request, edge: Served) -> web.StreamResponse:
    q = request.query
    after = 0 if "after" not in q else readside.parse_intake_cursor(q["after"])
    if after is None:
        raise bad("after", f"{show(q['after'])} is not a cursor of the intake list")
    limit = int_param(request, "limit", readside.DEFAULT_INTAKES, 1, readside.MAX_INTAKES)
    state = q.get("state")
    if state is not None and state not in readside.INTAKE_STATES:
        raise bad("state", f"{show(state)} is not pending or assigned")
    scope = request[READER].scope
    found = await stored(
        edge.store.read(
            lambda tx: readside.intakes_json(tx, state=state, after=after, limit=limit, scope=scope)
        )
    )
    return web.json_response(found)


async def resend(request: web.Request, edge: Served) -> web.StreamResponse:
    ref, rt, now = request.match_info["ref"], edge.rt, edge.clock.now()
    try:
        done = await stored(edge.store.write(lambda tx: intakes.resend(rt, tx, ref, now)))
    except intakes.IntakeError as exc:
        raise HttpRefusal(exc.code, exc.detail) from exc
    edge.on_commit.committed(done.wakes)
    log.info("intake resend remote=%s intake_ref=%s id=%s", request.remote, ref, done.message_id)
    return web.json_response(
        {"ok": True, "intake_ref": ref, "id": done.message_id, "outbox_id": done.outbox_id}
    )


ROUTES: Final = (
    Route("GET", INTAKES_PATH, intake_list, "reader"),
    Route("POST", RESEND_PATH, resend, "admin"),
)
