"""masd over MCP (docs/protocol.md §23), driven by the SDK's own client over streamable HTTP
against a real masd on loopback: who is shown which tools, each tool, the refusals.

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from support.mcp import body, mcp_world, session

READS = {"list_cases", "read_case", "read_message", "read_attachment", "wait_events"}
MASTER_ACTS = {"assign_case", "send_mail", "set_policy"}


async def tool_names(url: str, secret: str) -> set[str]:
    async with session(url, secret) as client:
        return {t.name for t in (await client.list_tools()).tools}


def test_each_caller_is_shown_its_own_tools(tmp_path: Path) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            t = w.tokens
            assert await tool_names(w.mcp_url, t["admin"]) == READS
            assert await tool_names(w.mcp_url, t["crm"]) == READS | MASTER_ACTS
            assert await tool_names(w.mcp_url, t["other"]) == READS | MASTER_ACTS
            assert await tool_names(w.mcp_url, t["callback"]) == {"post_status"}
            assert await tool_names(w.mcp_url, t["transfer"]) == {"post_status"}
            for secret in ("nobody-" + "x" * 20, None):
                headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
                async with httpx.AsyncClient() as http:
                    got = await http.post(w.mcp_url, json={}, headers=headers)
                assert got.status_code == 401, got.text
                assert got.json()["error"] == "unauthenticated"
                assert got.headers["www-authenticate"] == 'Bearer realm="masd"'
            for tool in ("post_status", "send_mail"):
                async with session(w.mcp_url, t["admin"]) as client:
                    refused = await client.call_tool(tool, {})
                assert refused.is_error
                assert body(refused)["error"] == "forbidden"

    asyncio.run(main())
