"""masd as an MCP server (docs/protocol.md §23), on the official SDK's low-level server.

:class:`McpEdge` answers ``tools/list`` with the caller's tools
(:func:`masd.edges.mcp_tools.tools_for`) and ``tools/call`` by the reading tools
(:mod:`masd.edges.mcp_reads`) or the acting ones (:mod:`masd.edges.mcp_acts`).  A refusal
is a tool error (``isError``) whose content is the HTTP answer's body,
``{"ok": false, "error": CODE, "detail": ...}``.  Who calls is the request's secret,
checked by the listener (:mod:`masd.edges.mcp_http`) and carried in the ASGI scope; on
stdio it is the one caller of the process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

from masd import __version__
from masd.edges import mcp_reads
from masd.edges.http.shared import HttpRefusal, Served
from masd.edges.mcp_acts import ACTS, Door, act
from masd.edges.mcp_caller import Caller
from masd.edges.mcp_tools import BY_NAME, tools_for

log = logging.getLogger("masd.mcp")

#: Where the listener puts the caller (and its secret) in a request's ASGI scope.
SEAT: Final = "masd.seat"
INSTRUCTIONS: Final = (
    "masd keeps the mail threads of cases. Read with list_cases, read_case, read_message "
    "and wait_events; answer with send_mail (an outside master) or post_status (a mode "
    "endpoint). Who you are is your secret: no tool names a sender."
)


@dataclass(frozen=True)
class Seat:
    """A caller and the secret it called with."""

    caller: Caller
    secret: str


def _result(body: Mapping[str, Any], *extra: types.ContentBlock) -> types.CallToolResult:
    text = json.dumps(body, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(text=text), *extra], structured_content=dict(body)
    )


def refused(kind: str, detail: str) -> types.CallToolResult:
    """A tool error naming the contract's error code and its detail."""
    body = {"ok": False, "error": kind, "detail": detail}
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, ensure_ascii=False))],
        structured_content=body,
        is_error=True,
    )


class McpEdge:
    """The tools of one masd: its read side and its POST (``door``); ``seat`` fixed for
    stdio, else each request's own (:data:`SEAT`)."""

    def __init__(self, edge: Served, door: Door, seat: Seat | None = None) -> None:
        self.edge = edge
        self.door = door
        self.seat = seat

    def server(self) -> Server[Any]:
        return Server(
            "masd",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    def _seat(self, ctx: ServerRequestContext[Any, Any]) -> Seat:
        if self.seat is not None:
            return self.seat
        scope = getattr(ctx.request, "scope", None) or {}
        seat = scope.get(SEAT)
        assert isinstance(seat, Seat), "the MCP listener checks every request's secret"
        return seat

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        del params
        shown = tools_for(self._seat(ctx).caller)
        return types.ListToolsResult(
            tools=[
                types.Tool(name=t.name, description=t.description, input_schema=t.schema)
                for t in shown
            ]
        )

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        seat = self._seat(ctx)
        args = params.arguments or {}
        spec = BY_NAME.get(params.name)
        if spec is None:
            return refused("invalid-message", f"name: no tool {params.name[:64]}")
        if not spec.shown_to(seat.caller):
            return refused("forbidden", f"name: {spec.name} is not a tool of this secret")
        try:
            return await self._run(seat, spec.name, args)
        except HttpRefusal as exc:
            log.info(
                "mcp refused caller=%s tool=%s error=%s", seat.caller.name, spec.name, exc.kind
            )
            return refused(exc.kind, exc.detail)
        except Exception:  # masd's own fault: named, never a traceback to the caller
            log.exception("mcp fault caller=%s tool=%s", seat.caller.name, spec.name)
            return refused("unavailable", "masd failed; retry later (see its log)")

    async def _run(self, seat: Seat, name: str, args: Mapping[str, Any]) -> types.CallToolResult:
        edge, who = self.edge, seat.caller.reader
        if name in ACTS:
            answer = await act(self.door, seat.caller, seat.secret, name, args)
            if answer.status >= 300:
                return refused(
                    str(answer.body.get("error", "unavailable")),
                    str(answer.body.get("detail", f"status {answer.status}")),
                )
            return _result(answer.body)
        assert who is not None  # a reading tool is shown to readers only
        if name == "read_attachment":
            entry, data = await mcp_reads.read_attachment(edge, who, args)
            mime = entry.get("content_type") or "application/octet-stream"
            if data is None:
                link = types.ResourceLink(
                    uri=entry["url"],
                    name=entry.get("filename") or f"attachment-{entry['n']}",
                    mime_type=mime,
                    size=entry["size"],
                )
                return _result({"attachment": entry, "inline": False}, link)
            blob = types.BlobResourceContents(
                uri=entry["url"], mime_type=mime, blob=mcp_reads.blob(data)
            )
            return _result(
                {"attachment": entry, "inline": True}, types.EmbeddedResource(resource=blob)
            )
        reading = {
            "list_cases": mcp_reads.list_cases,
            "read_case": mcp_reads.read_case,
            "read_message": mcp_reads.read_message,
            "wait_events": mcp_reads.wait_events,
        }[name]
        return _result(await reading(edge, who, args))
