"""The acting tools of the MCP edge: a contract message built from the tool's arguments and
taken by the HTTP POST's own path (docs/protocol.md §9, §23).

A tool's arguments become the body of one contract message (``mas_modes_version``,
``type`` and ``id`` set here; nothing names the sender, who is the caller's secret).  That
body goes where ``POST /mas/v0.1/messages`` sends its body once it is read: the bound of
:data:`~masd.edges.http.shared.MAX_BODY`, :func:`masd.core.wire.parse_envelope`,
:func:`masd.core.wire.check_may_send`, then one store job of :func:`masd.service.receive`
(idempotency, schema, unknown case or handoff, forbidden, the seq rule, transitions), whose
answer is the tool's.  ``masd mcp`` (stdio) hands the body to the running masd's HTTP
listener instead (:class:`OverHttp`), so its outbox sends at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx

from masd import service
from masd.core import wire
from masd.core.errors import WireError
from masd.edges.http.shared import MAX_BODY, MESSAGES_PATH, HttpRefusal, Served, status_of
from masd.edges.mcp_caller import Caller
from masd.logs import shown
from masd.service.peer_directory import Principal
from masd.store import StoreError

log = logging.getLogger("masd.mcp")

#: The message type each acting tool sends, and the arguments it copies into the body.
ACTS: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    "assign_case": ("case.assign", ("intake_ref", "resource_id", "policy")),
    "send_mail": ("mail.send", ("case", "in_reply_to", "subject", "body")),
    "set_policy": ("case.policy", ("case", "autonomous_send", "transfers")),
    "post_status": (
        "handoff.status",
        ("case", "handoff_id", "seq", "status", "needs", "at", "outcome", "reason", "detail"),
    ),
}


@dataclass(frozen=True)
class Answer:
    """The POST's answer: its HTTP status and body."""

    status: int
    body: dict[str, Any]


class Door(Protocol):
    """Where a contract message goes: the POST's path, in this process or another."""

    async def post(self, principal: Principal, secret: str, raw: bytes) -> Answer: ...


def body_of(tool: str, args: Mapping[str, Any]) -> bytes:
    """The contract message ``tool`` sends with ``args``.  Its ``id`` is the one given, or
    a digest of the tool and its arguments: the same call twice is one message."""
    mtype, names = ACTS[tool]
    given = {name: args[name] for name in names if args.get(name) is not None}
    mid = args.get("id")
    if mid is None:
        canon = json.dumps([tool, given], sort_keys=True, ensure_ascii=False)
        mid = "mcp-" + hashlib.sha256(canon.encode()).hexdigest()[:40]
    body = {"mas_modes_version": wire.VERSION, "type": mtype, "id": mid, **given}
    return json.dumps(body, ensure_ascii=False).encode()


async def act(
    door: Door, caller: Caller, secret: str, tool: str, args: Mapping[str, Any]
) -> Answer:
    """Send the message of ``tool``; a refusal before the store is an :class:`HttpRefusal`."""
    principal = caller.principal
    mtype = ACTS[tool][0]
    if principal is None or not caller.may_send(mtype):
        raise HttpRefusal("forbidden", f"type: {caller.name} may not send {mtype} to email")
    if any(p.signing.required for p in principal.peers):
        raise HttpRefusal(
            "unauthenticated",
            f"{principal.id} must sign its requests (require_signature): MCP carries no "
            "signature; POST /mas/v0.1/messages instead",
        )
    raw = body_of(tool, args)
    if len(raw) > MAX_BODY:
        raise HttpRefusal("too-large", f"body: over {MAX_BODY} bytes")
    return await door.post(principal, secret, raw)


class InProcess:
    """The POST's path in this process: what ``masd serve``'s MCP listener uses."""

    def __init__(self, edge: Served) -> None:
        self.edge = edge

    async def post(self, principal: Principal, secret: str, raw: bytes) -> Answer:
        del secret  # the caller is known: its secret was checked
        edge = self.edge
        try:
            env = wire.parse_envelope(raw)
            wire.check_may_send(principal.kind, env)
        except WireError as exc:
            raise HttpRefusal(exc.code, exc.detail) from exc
        now = edge.clock.now()
        try:
            got = await edge.store.write(
                lambda db: service.receive(edge.rt, db, principal, env, now, status_of)
            )
        except StoreError as exc:
            raise HttpRefusal("unavailable", f"store: {exc.detail}") from exc
        edge.on_commit.committed(got.wakes)
        case = env.body.get("case")
        log.info(
            "mcp message peer=%s type=%s id=%s case=%s status=%d error=%s",
            principal.id,
            env.type,
            env.id,
            shown(case.get("key") if isinstance(case, dict) else None),
            got.status,
            got.body.get("error", "-"),
        )
        return Answer(got.status, dict(got.body))


class OverHttp:
    """The running masd's ``POST /mas/v0.1/messages`` (``masd mcp`` beside ``masd serve``);
    where no masd answers, the POST's path on the store itself (``local``), whose outbox
    rows go out when masd starts."""

    def __init__(self, url: str, transport: httpx.AsyncBaseTransport | None, local: Door) -> None:
        self.url = url
        self.transport = transport
        self.local = local

    async def post(self, principal: Principal, secret: str, raw: bytes) -> Answer:
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        try:
            async with httpx.AsyncClient(transport=self.transport, timeout=30.0) as client:
                response = await client.post(self.url + MESSAGES_PATH, content=raw, headers=headers)
        except (httpx.ConnectError, FileNotFoundError):
            return await self.local.post(principal, secret, raw)
        except httpx.HTTPError as exc:
            raise HttpRefusal("unavailable", f"{self.url}{MESSAGES_PATH}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise HttpRefusal(
                "unavailable", f"{self.url}: not a JSON answer ({response.status_code})"
            )
        return Answer(response.status_code, body)
