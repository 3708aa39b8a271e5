"""Who calls over MCP: the caller its secret authenticates (docs/protocol.md §23).

The secret is the HTTP ``Authorization: Bearer`` of each request (the token file of
``masd mcp`` on stdio).  What it may read is decided by the HTTP read side's rule
(:func:`masd.edges.http.auth.reader_of`), what it may send by the HTTP POST's
(:func:`masd.edges.http.auth.peer_of`, :data:`masd.core.wire.MAY_SEND`): a caller is shown
the tools those allow, and nothing names a caller but its secret.
"""

from __future__ import annotations

from dataclasses import dataclass

from masd.core import wire
from masd.edges.http.auth import peer_of, reader_of
from masd.edges.http.shared import HttpRefusal
from masd.read.access import Reader
from masd.service import Runtime
from masd.service.peer_directory import Principal


@dataclass(frozen=True)
class Caller:
    """``reader``: what the read side lets this secret read (None: nothing);
    ``principal``: the peer the secret is (None: the admin, who sends nothing)."""

    name: str
    reader: Reader | None
    principal: Principal | None

    def may_send(self, mtype: str) -> bool:
        """Whether the HTTP POST would take a message of type ``mtype`` from this caller."""
        kind = self.principal.kind if self.principal is not None else ""
        return mtype in wire.MAY_SEND.get(kind, frozenset())


def caller_of(rt: Runtime, secret: str | None) -> Caller:
    """The caller ``secret`` names; ``unauthenticated`` when it names none."""
    try:
        reader: Reader | None = reader_of(rt, secret)
    except HttpRefusal as exc:
        if exc.kind != "forbidden":
            raise  # no secret, or one that matches nobody
        reader = None  # a peer that reads nothing (a mode endpoint, a webhook)
    try:
        principal: Principal | None = peer_of(rt, secret)
    except HttpRefusal:
        principal = None  # the admin secret: no peer
    name = principal.id if principal is not None else "admin"
    return Caller(name, reader, principal)
