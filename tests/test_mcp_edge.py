"""The MCP edge in-process over the HTTP edge's state (docs/protocol.md §23): who is shown
which tools, and refusals that carry the HTTP answer's code and detail, driven by the SDK's
own client over streamable HTTP on loopback.  tests/test_mcp.py runs a real masd.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from support.http import ADMIN, CALLBACK, CRM, serving, write_config
from support.mcp import body, session

from masd.config import ConfigErrors, TcpListen, format_summary, load_config
from masd.edges.descriptors import need
from masd.edges.http import HttpLimits
from masd.edges.mcp_http import start_mcp


def test_tools_by_secret_and_refusals_as_on_http(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as running:
            assert running.edge is not None
            mcp = await start_mcp(TcpListen("127.0.0.1", 0), running.edge.served, HttpLimits())
            host, port = mcp.addresses[0]
            url = f"http://{host}:{port}/mcp"
            try:
                shown = {}
                for name, secret in (("admin", ADMIN), ("crm", CRM), ("callback", CALLBACK)):
                    async with session(url, secret) as client:
                        shown[name] = {t.name for t in (await client.list_tools()).tools}
                        for tool in (await client.list_tools()).tools:
                            props = tool.input_schema.get("properties", {})
                            assert not {"sender", "from", "caller", "peer"} & set(props)
                assert "send_mail" not in shown["admin"]
                assert "read_case" in shown["admin"]
                assert {"send_mail", "read_case"} <= shown["crm"]
                assert shown["callback"] == {"post_status"}

                async with session(url, ADMIN) as admin:
                    missing = await admin.call_tool(
                        "read_case", {"key": "ticket=nope@help.example"}
                    )
                    http = await running.client.get(
                        "/mas/v0.1/cases/ticket=nope@help.example",
                        headers={"Authorization": f"Bearer {ADMIN}"},
                    )
                    assert missing.is_error
                    assert body(missing) == http.json()
                    no_key = await admin.call_tool("read_case", {})
                    assert body(no_key) == {
                        "ok": False,
                        "error": "invalid-message",
                        "detail": "key: missing",
                    }
                    unknown = await admin.call_tool("drop_tables", {})
                    assert body(unknown)["error"] == "invalid-message"
                async with session(url, CALLBACK) as mode:
                    reading = await mode.call_tool("list_cases", {})
                    assert body(reading)["error"] == "forbidden"
                    status = {
                        "case": {
                            "address": "ticket=x@help.example",
                            "key": "ticket=x@help.example",
                        },
                        "handoff_id": "h" * 32,
                        "seq": "one",
                        "status": "running",
                        "id": "status-1",
                    }
                    got = await mode.call_tool("post_status", status)
                    posted = await running.client.post(
                        "/mas/v0.1/messages",
                        json={"mas_modes_version": "0.1", "type": "handoff.status", **status},
                        headers={"Authorization": f"Bearer {CALLBACK}"},
                    )
                    assert body(got) == posted.json()
                    assert body(got)["error"] == "invalid-message"
                async with httpx.AsyncClient() as plain:
                    nobody = await plain.post(url, json={}, headers={"Authorization": "Bearer x-y"})
                assert nobody.status_code == 401
                assert nobody.json()["error"] == "unauthenticated"
            finally:
                await mcp.close()

    asyncio.run(main())


def test_server_mcp_in_the_configuration(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("[server]\n", '[server]\nmcp = "127.0.0.1:8026"\n', 1))
    config = load_config(path)
    assert config.server.mcp == TcpListen("127.0.0.1", 8026)
    assert "mcp       127.0.0.1:8026" in format_summary(config)
    assert need(config.server, ["http", "mcp"]).caps[-1] == (
        "server.max_http_connections (mcp)",
        config.server.max_http_connections,
    )
    path.write_text(text.replace("[server]\n", '[server]\nmcp = "127.0.0.1:8025"\n', 1))
    with pytest.raises(ConfigErrors) as refused:
        load_config(path)
    assert 'server.mcp: "127.0.0.1:8025" is also server.http' in str(refused.value)
    assert load_config(write_config(tmp_path)).server.mcp is None


def test_the_current_revision_per_request_is_served_too(tmp_path: Path) -> None:
    """The SDK's high-level client negotiates the protocol's current revision (no handshake,
    each request on its own); the caller is still its secret's."""

    async def main() -> None:
        async with serving(tmp_path) as running:
            assert running.edge is not None
            mcp = await start_mcp(TcpListen("127.0.0.1", 0), running.edge.served, HttpLimits())
            host, port = mcp.addresses[0]
            url = f"http://{host}:{port}/mcp"
            try:
                for secret, expected in ((CRM, "send_mail"), (CALLBACK, "post_status")):
                    headers = {"Authorization": f"Bearer {secret}"}
                    async with (
                        create_mcp_http_client(headers=headers) as http,
                        Client(streamable_http_client(url, http_client=http)) as client,
                    ):
                        assert client.protocol_version == "2026-07-28"
                        names = {t.name for t in (await client.list_tools()).tools}
                        assert expected in names
                        if secret == CALLBACK:
                            assert names == {"post_status"}
                            refused = await client.call_tool("read_case", {"key": "x"})
                            assert body(refused)["error"] == "forbidden"
                        else:
                            listed = await client.call_tool("list_cases", {})
                            assert body(listed) == {"cases": [], "next": None}
            finally:
                await mcp.close()

    asyncio.run(main())
