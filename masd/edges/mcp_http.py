"""The MCP listener (``server.mcp``, docs/protocol.md §23): streamable HTTP at ``/mcp``.

An aiohttp server like the HTTP listener, under the same limits
(:class:`~masd.edges.http.HttpLimits`: ``server.max_http_connections`` connections at once,
10 s for a request head, 75 s for an idle keep-alive connection) and with the same
answers before MCP is spoken: a secret that names no caller is ``401 unauthenticated``
(:func:`masd.edges.mcp_caller.caller_of`), another path ``404``.  What passes is handed to
the SDK's session manager (an ASGI application) with the caller in its scope; stateless,
so each request is who its own secret says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import MutableMapping
from typing import Any, Final

from aiohttp import web
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from masd.config import Listen
from masd.edges.accept import AcceptServer
from masd.edges.http import HttpLimits, HttpRefusal
from masd.edges.http.server import _over_the_limit
from masd.edges.http.shared import Served, bearer
from masd.edges.limits import Gate
from masd.edges.mcp_acts import InProcess
from masd.edges.mcp_caller import caller_of
from masd.edges.mcp_server import SEAT, McpEdge, Seat
from masd.edges.sockets import ListenError, serve

log = logging.getLogger("masd.mcp")

MCP_PATH: Final = "/mcp"
#: The largest JSON-RPC request taken (a contract message in it is bounded again).
MAX_REQUEST: Final = 1024 * 1024


class McpListenError(ListenError):
    """The MCP listener cannot start."""

    code = "mcp-listen"


def _scope(request: web.Request, seat: Seat) -> dict[str, Any]:
    """The ASGI scope of ``request``, with the caller (:data:`SEAT`)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(),
        "root_path": "",
        "query_string": request.query_string.encode(),
        "headers": [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
        ],
        "client": request.transport.get_extra_info("peername") if request.transport else None,
        "server": None,
        "state": {},
        SEAT: seat,
    }


async def _asgi(
    manager: StreamableHTTPSessionManager, request: web.Request, seat: Seat
) -> web.StreamResponse:
    """One request through the SDK's ASGI application, its answer streamed back."""
    body = await request.read()
    given = False
    done = asyncio.Event()
    response: web.StreamResponse | None = None

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal response
        if message["type"] == "http.response.start":
            response = web.StreamResponse(status=message["status"])
            for k, v in message.get("headers", []):
                name, value = k.decode("latin-1"), v.decode("latin-1")
                if name.lower() == "content-length":
                    response.content_length = int(value)
                elif name.lower() != "transfer-encoding":
                    response.headers.add(name, value)
            await response.prepare(request)
        elif message["type"] == "http.response.body" and response is not None:
            if data := message.get("body", b""):
                await response.write(data)
            if not message.get("more_body", False):
                await response.write_eof()

    try:
        await manager.handle_request(_scope(request, seat), receive, send)
    finally:
        done.set()
    if response is None:
        raise HttpRefusal("unavailable", "masd failed; retry later (see its log)")
    return response


class McpServer:
    """A started MCP listener: ``addresses`` as bound, ``gate`` its counts, ``close()``."""

    def __init__(self, mcp: McpEdge, limits: HttpLimits) -> None:
        self.mcp = mcp
        self.limits = limits
        self.manager = StreamableHTTPSessionManager(
            app=mcp.server(), json_response=True, stateless=True
        )
        self.gate = Gate(
            _unset,
            name="mcp",
            limit=limits.max_connections,
            refusal=_over_the_limit(limits.max_connections),
            header_timeout=limits.header_timeout,
        )
        self.addresses: list[tuple[str, int] | str] = []
        self._runner: web.AppRunner | None = None
        self._server: AcceptServer | None = None
        self._running: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.gate.started(request.transport)
        try:
            if request.path != MCP_PATH:
                raise HttpRefusal("not-found", f"path: {request.path} is not served here")
            secret = bearer(request)
            seat = Seat(caller_of(self.mcp.edge.rt, secret), secret or "")
            return await _asgi(self.manager, request, seat)
        except HttpRefusal as refused:
            return refused.response()
        except web.HTTPException as exc:
            kind = "too-large" if exc.status == 413 else "invalid-message"
            return HttpRefusal(kind, f"{exc.reason}", status=exc.status).response()
        except Exception:  # masd's own fault: JSON and 503, never a traceback
            log.exception("mcp fault method=%s path=%s", request.method, request.path)
            return HttpRefusal("unavailable", "masd failed; retry later (see its log)").response()
        finally:
            self.gate.finished(request.transport)

    async def _manage(self, started: asyncio.Event) -> None:
        async with self.manager.run():
            started.set()
            await self._stop.wait()

    async def start(self, listen: Listen) -> None:
        started = asyncio.Event()
        self._running = asyncio.create_task(self._manage(started), name="masd-mcp")
        await started.wait()
        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=10.0,
            keepalive_timeout=self.limits.keepalive_timeout,
        )
        await runner.setup()
        assert runner.server is not None
        self.gate.factory = runner.server
        try:
            self._server = await serve(self.gate, listen, error=McpListenError)
        except BaseException:
            await self.close()
            raise
        for sock in self._server.sockets:
            name = sock.getsockname()
            self.addresses.append(
                (str(name[0]), int(name[1])) if isinstance(name, tuple) else str(name)
            )
        log.info("mcp listening on %s", ", ".join(str(a) for a in self.addresses))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()
        self._stop.set()
        if self._running is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._running


def _unset() -> asyncio.Protocol:
    raise AssertionError("the MCP gate is used before the server is set up")


async def start_mcp(listen: Listen, edge: Served, limits: HttpLimits) -> McpServer:
    """Serve MCP on ``listen`` with the tools of the HTTP edge's ``edge``."""
    logging.getLogger("mcp").setLevel(logging.WARNING)  # a line per request otherwise
    started = McpServer(McpEdge(edge, InProcess(edge)), limits)
    await started.start(listen)
    return started
