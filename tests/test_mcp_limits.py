"""The MCP listener's limits (docs/protocol.md §23, §9): the HTTP listener's request-head
timeout and keep-alive idle timeout, here injected small, on the HTTP edge's own state
in-process; the clients are raw sockets and the SDK's own client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from support.http import CALLBACK, CRM, Running, serving
from support.mcp import session

from masd.config import TcpListen
from masd.edges.http import HttpLimits
from masd.edges.mcp_http import McpServer, start_mcp

WAIT = 10.0


def run(
    tmp_path: Path, body: Callable[[Running, McpServer], Awaitable[None]], **limits: float
) -> None:
    async def main() -> None:
        async with serving(tmp_path) as running:
            assert running.edge is not None
            mcp = await start_mcp(
                TcpListen("127.0.0.1", 0), running.edge.served, HttpLimits(**limits)
            )
            try:
                await body(running, mcp)
            finally:
                await mcp.close()

    asyncio.run(main())


def url(mcp: McpServer) -> str:
    host, port = mcp.addresses[0]
    return f"http://{host}:{port}/mcp"


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (what was left to read, then EOF)."""
    try:
        await asyncio.wait_for(reader.read(), WAIT)
    except ConnectionResetError:
        return True
    return reader.at_eof()


def test_a_connection_that_sends_nothing_is_closed_at_the_head_timeout(tmp_path: Path) -> None:
    async def body(r: Running, mcp: McpServer) -> None:
        host, port = mcp.addresses[0]
        reader, writer = await asyncio.open_connection(host, port)
        assert await closed_by_server(reader)
        writer.close()
        assert mcp.gate.timed_out == 1
        async with session(url(mcp), CRM) as client:  # the listener still answers
            assert "send_mail" in {t.name for t in (await client.list_tools()).tools}

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=30)


def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path) -> None:
    async def body(r: Running, mcp: McpServer) -> None:
        host, port = mcp.addresses[0]
        reader, writer = await asyncio.open_connection(host, port)
        request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        writer.write(
            b"POST /mcp HTTP/1.1\r\nHost: masd\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\n"
            + f"Authorization: Bearer {CALLBACK}\r\nContent-Length: {len(request)}\r\n\r\n".encode()
            + request
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert await closed_by_server(reader)  # answered, then idle past the keep-alive timeout
        writer.close()
        assert mcp.gate.timed_out == 0

    run(tmp_path, body, header_timeout=5, keepalive_timeout=0.5)
