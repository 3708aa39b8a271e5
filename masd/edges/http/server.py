"""The HTTP listener: bound, limited, started and closed (docs/protocol.md §9).

Limits (:class:`HttpLimits`): a request head must arrive within 10 s of its first byte (or
of the connection), an idle keep-alive connection is closed after 75 s, and at most
``server.max_http_connections`` are open at once; one more is answered 503 as it is
accepted and closed (:mod:`masd.edges.limits`).  A header field is read up to
:data:`PARSED_HEADER_FIELD` bytes, so one over masd's own bound
(:data:`~masd.edges.http.shared.MAX_HEADER_FIELD`) is refused naming it; a request the
parser itself refuses (a longer field, a request line that is not HTTP) is answered as
masd's JSON refusal too (:class:`_Connection`), and the connection closed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from masd.config import Listen
from masd.edges.accept import AcceptServer
from masd.edges.http.edge import HttpEdge
from masd.edges.http.shared import MAX_HEADER_FIELD, RETRY_AFTER, HttpRefusal
from masd.edges.limits import Gate
from masd.edges.sockets import ListenError, serve
from masd.logs import parser_refusal

log = logging.getLogger("masd.http")

#: docs/protocol.md §9: the limits, by default (``server.max_http_connections`` for the cap).
HEADER_TIMEOUT: Final = 10.0
KEEPALIVE_TIMEOUT: Final = 75.0
MAX_CONNECTIONS: Final = 1000
#: The bytes of one header field the HTTP parser reads before it refuses the request.
PARSED_HEADER_FIELD: Final = 2 * MAX_HEADER_FIELD
#: A header field's name (RFC 9110 §5.1) at the start of the line the parser quotes.
_FIELD_NAME: Final = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,60}):")


class _ServerLog(logging.Logger):
    """The HTTP server's own log: a request it cannot parse is the client's
    fault, one INFO line; anything else keeps its traceback."""

    def exception(
        self, msg: object, *args: object, exc_info: object = True, **kwargs: object
    ) -> None:
        if isinstance(exc_info, HttpProcessingError):
            text = str(msg) % args if args else str(msg)
            # never the header line it quotes
            reason = _too_long(exc_info) if isinstance(exc_info, LineTooLong) else None
            reason = reason or parser_refusal(str(exc_info))
            log.info("%s: not a valid HTTP request (%s)", text, reason[:300])
            return
        log.error(msg, *args, exc_info=exc_info if isinstance(exc_info, BaseException) else True)


_SERVER_LOG: Final = _ServerLog("masd.http.server")


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, whose own refusals (a request its parser cannot
    read) are answered as masd's JSON, the connection then closed."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if already answering
        response = _parser_refusal(status, exc).response()
        response.force_close()
        return response


def _too_long(exc: LineTooLong) -> str:
    """What the parser found too long, without its bytes: the field's name when the line it
    quotes starts with one."""
    line = exc.args[0] if isinstance(exc.args[0], bytes) else str(exc.args[0]).encode()
    named = _FIELD_NAME.match(line)
    what = f"{named.group(1).decode()}: a header field" if named else "a line or header field"
    return f"{what} over {exc.args[1]} bytes"


def _parser_refusal(status: int, exc: BaseException | None) -> HttpRefusal:
    if status >= 500:
        return HttpRefusal("unavailable", "masd failed; retry later (see its log)")
    if isinstance(exc, LineTooLong):
        return HttpRefusal("invalid-message", f"request head: {_too_long(exc)}")
    why = parser_refusal(str(exc)) if exc is not None else "unreadable"
    return HttpRefusal("invalid-message", f"request: not valid HTTP ({why[:200]})")


class HttpListenError(ListenError):
    """The HTTP listener cannot start (address in use, a non-socket at the path)."""

    code = "http-listen"


@dataclass(frozen=True)
class HttpLimits:
    """docs/protocol.md §9's limits on the HTTP listener (seconds and a count)."""

    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT


def _over_the_limit(limit: int) -> bytes:
    """The whole answer to a connection over the limit: 503, then the close."""
    body = json.dumps(
        {
            "ok": False,
            "error": "unavailable",
            "detail": f"{limit} connections open (server.max_http_connections); retry later",
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Retry-After: {RETRY_AFTER}\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class HttpServer:
    """A started listener: ``addresses`` as bound, ``gate`` its counts, ``close()``."""

    def __init__(self, runner: web.AppRunner, server: AcceptServer, gate: Gate) -> None:
        self._runner = runner
        self._server = server
        self.gate = gate
        self.addresses: list[tuple[str, int] | str] = []
        for sock in server.sockets:
            name = sock.getsockname()
            if isinstance(name, tuple):
                self.addresses.append((str(name[0]), int(name[1])))
            else:
                self.addresses.append(str(name))

    async def close(self) -> None:
        """Stop accepting, let requests in flight finish, then close."""
        self._server.close()
        await self._runner.cleanup()
        await self._server.wait_closed()


async def start_http(
    listen: Listen,
    edge: HttpEdge,
    *,
    sock: socket.socket | None = None,
    limits: HttpLimits = HttpLimits(),
) -> HttpServer:
    """Bind ``listen`` (TCP, port 0 allowed, or a unix socket, mode 0660 before
    it accepts anyone) and serve.

    ``sock``, an already listening socket (socket activation), is served
    instead of binding ``listen``.
    """
    gate = Gate(
        _unset,
        name="http",
        limit=limits.max_connections,
        refusal=_over_the_limit(limits.max_connections),
        header_timeout=limits.header_timeout,
        on_refused=lambda: edge.metrics.inc("masd_connections_refused_total", listener="http"),
    )
    handler_args: dict[str, Any] = {
        "access_log": None,
        "keepalive_timeout": limits.keepalive_timeout,
        "logger": _SERVER_LOG,
        "max_field_size": PARSED_HEADER_FIELD,
    }
    runner = web.AppRunner(edge.app(gate), shutdown_timeout=10.0, **handler_args)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    gate.factory = functools.partial(_Connection, runner.server, loop=loop, **handler_args)
    try:
        server = await serve(gate, listen, sock=sock, error=HttpListenError)
    except BaseException:
        await runner.cleanup()
        raise
    started = HttpServer(runner, server, gate)
    log.info("http listening on %s", ", ".join(str(a) for a in started.addresses))
    return started


def _unset() -> asyncio.Protocol:
    raise AssertionError("the HTTP gate is used before the server is set up")
