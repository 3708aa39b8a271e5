"""masd with its MCP listener on loopback, and the SDK's own client to talk to it.

:func:`mcp_world` starts masd (``server.mcp`` on) with: the slave type ``case`` of
``help.example`` (its master ``crm``, a transfers webhook), the other master (type ``order``
and ``other.example``), and the master-role type ``ticket`` whose ``callback`` mode endpoint
is a :class:`~masd.testing.peers.FakePeer`.  :func:`session` opens an MCP session over
streamable HTTP with a secret; :func:`stdio_session` one with ``masd mcp`` as a child.
"""

from __future__ import annotations

import email
import email.policy
import json
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from masd.testing import lmtpclient
from masd.testing.config import server_table, write_config
from masd.testing.net import free_ports
from masd.testing.peers import FakePeer, SmtpSink
from masd.testing.process import child_env
from support.masd_process import DOMAIN, WAIT, MasdProcess, mx_mail

INTAKE = f"case@{DOMAIN}"
ANN = "ann@example.org"


@dataclass
class World:
    directory: Path
    config: Path
    tokens: dict[str, str]
    lmtp_port: int
    http_port: int
    mcp_port: int
    masd: MasdProcess
    master: FakePeer
    endpoint: FakePeer
    sink: SmtpSink

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.mcp_port}/mcp"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def token_file(self, name: str) -> Path:
        return self.directory / "secrets" / f"{name}.token"

    async def mail(
        self, rcpt: str, sender: str = ANN, *, files: tuple[bytes, ...] = (), **kw: Any
    ) -> str:
        """Deliver a mail (with ``files`` attached) over LMTP; its Message-ID."""
        message_id, data = mx_mail(sender, rcpt, **kw)
        if files:
            msg = email.message_from_bytes(data, _class=EmailMessage, policy=email.policy.SMTP)
            for n, content in enumerate(files):
                msg.add_attachment(
                    content, maintype="application", subtype="octet-stream", filename=f"f{n}.bin"
                )
            data = msg.as_bytes()
        result = await lmtpclient.deliver(
            ("127.0.0.1", self.lmtp_port), sender, [rcpt], data, timeout=WAIT
        )
        assert result.codes == (250,), result
        return message_id

    async def intake(self, **kw: Any) -> dict[str, Any]:
        """An intake mail to case@; the case.intake the master got for it."""
        before = len(self.master.requests)
        message_id = await self.mail(INTAKE, **kw)
        await self.master.wait_for(before + 1, WAIT)
        for r in self.master.requests:
            body = r.json or {}
            if body.get("type") == "case.intake" and body["event"]["message_id"] == message_id:
                return body
        raise AssertionError(f"no case.intake for {message_id}")


@asynccontextmanager
async def mcp_world(directory: Path, **server_keys: Any) -> AsyncIterator[World]:
    """masd on loopback with ``server.mcp`` on (and ``server_keys`` in ``[server]``)."""
    names = ("admin", "crm", "other", "transfer", "callback")
    tokens = {name: f"{name}-{secrets.token_hex(16)}" for name in names}
    async with FakePeer() as master, FakePeer() as endpoint, SmtpSink() as sink:
        lmtp_port, http_port, mcp_port = free_ports(3)
        server = server_table(
            lmtp_port=lmtp_port,
            http_port=http_port,
            smtp_port=sink.port,
            mcp=f"127.0.0.1:{mcp_port}",
            **server_keys,
        )
        other = {"url": "http://127.0.0.1:9/other", "token_file": "secrets/other.token"}
        types = {
            "case": {
                "role": "slave",
                "master": {"url": master.url + "mas", "token_file": "secrets/crm.token"},
                "policy": {"autonomous_send": True, "transfers": "block"},
                "require_dmarc_for_handoff": False,
                "webhooks": [
                    {
                        "url": master.url + "transfer",
                        "token_file": "secrets/transfer.token",
                        "fields": ["phone"],
                    }
                ],
            },
            "order": {"role": "slave", "master": other},
            "ticket": {
                "role": "master",
                "modes": ["callback"],
                "endpoints": {
                    "callback": {
                        "url": endpoint.url + "mas",
                        "token_file": "secrets/callback.token",
                        "deadline": "1h",
                        "fields": ["phone"],
                    }
                },
            },
        }
        doc = {
            "server": server,
            "domains": {
                DOMAIN: {"types": types},
                "other.example": {"types": {"case": {"role": "slave", "master": other}}},
            },
        }
        config = write_config(directory, doc, tokens)
        async with MasdProcess(config, directory / "masd.log") as masd:
            ports = (lmtp_port, http_port, mcp_port)
            yield World(directory, config, tokens, *ports, masd, master, endpoint, sink)


@asynccontextmanager
async def session(url: str, secret: str | None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session over streamable HTTP with ``secret`` as its Bearer."""
    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        yield client


def stdio_params(config: Path, token_file: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "masd", "mcp", "--config", str(config), "--token-file", str(token_file)],
        env=child_env(this_masd=True),
        cwd=str(config.parent),
    )


@asynccontextmanager
async def stdio_session(config: Path, token_file: Path) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with ``masd mcp`` as a child process."""
    async with (
        stdio_client(stdio_params(config, token_file)) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        yield client


def body(result: Any) -> dict[str, Any]:
    """A tool result's JSON (its first text content)."""
    found: dict[str, Any] = json.loads(result.content[0].text)
    return found
