"""A running HTTP edge on loopback for tests: real config file, real store, real sockets."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from masd import service
from masd.clock import Clock
from masd.config import Config, Listen, TcpListen, load_config
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.core.times import rfc3339
from masd.core.trust import TrustSettings
from masd.edges.context import EdgeContext
from masd.edges.http import HttpEdge, HttpLimits, HttpServer, start_http
from masd.edges.lmtp import LmtpHandler
from masd.metrics import Metrics
from masd.store import Store

TOKENS = {
    "admin.token": "admin-secret-7f3a91c2-5be04d8e1a96c3f0",
    "callback.token": "callback-secret-51be0d77",
    "chat.token": "chat-secret-a04c6e19",
    "crm.token": "crm-secret-9d2210fa",
}
ADMIN = TOKENS["admin.token"]
CALLBACK = TOKENS["callback.token"]
CHAT = TOKENS["chat.token"]
CRM = TOKENS["crm.token"]


def write_config(directory: Path, *, admin: bool = True) -> Path:
    """A masd.toml with a master type (modes callback and chat) and a slave type."""
    for name, token in TOKENS.items():
        path = directory / name
        path.write_text(token + "\n")
        path.chmod(0o600)
    admin_line = 'admin_token_file = "admin.token"\n' if admin else ""
    config = directory / "masd.toml"
    config.write_text(
        f"""\
[server]
http = "127.0.0.1:8025"
public_url = "http://127.0.0.1:8025"
database = "{directory / "masd.db"}"
trusted_authserv_ids = ["mx.help.example"]
{admin_line}
[domains."help.example".types.ticket]
role = "master"
modes = ["callback", "chat"]
id_prefix = "gs-"

[domains."help.example".types.ticket.endpoints.callback]
url = "http://127.0.0.1:9/mas"
token_file = "callback.token"
deadline = "2h"
fields = ["phone"]

[domains."help.example".types.ticket.endpoints.chat]
url = "http://127.0.0.1:9/chat"
token_file = "chat.token"
deadline = "2h"

[domains."help.example".types.case]
role = "slave"
master = {{ url = "http://127.0.0.1:9/crm", token_file = "crm.token" }}
"""
    )
    return config


def mail_bytes(
    rcpt: str, *, subject: str = "Printer jams", sender: str = "alice@example.com", body: str = ""
) -> bytes:
    """A plain mail whose trusted A-R says DMARC pass for the sender's domain."""
    domain = sender.rpartition("@")[2]
    return (
        f"Authentication-Results: mx.help.example; dmarc=pass header.from={domain}\r\n"
        f"From: Alice <{sender}>\r\n"
        f"To: {rcpt}\r\n"
        f"Subject: {subject}\r\n"
        f"Message-ID: <{secrets.token_hex(8)}@example.com>\r\n"
        "Date: Sun, 29 Nov 2026 19:50:01 +0000\r\n"
        "\r\n"
        f"{body or 'Please call me back.'}\r\n"
    ).encode()


async def deliver(
    store: Store, rt: service.Runtime, rcpt: str, now: float, **kw: Any
) -> service.Delivered:
    """Record a mail to ``rcpt`` through the real delivery path, in one store job."""
    config = rt.config
    raw = mail_bytes(rcpt, **kw)
    trust = TrustSettings.of(config.server.trusted_authserv_ids, config.server.trusted_hosts)
    mail = build_event(
        raw,
        mail_from=kw.get("sender", "alice@example.com"),
        rcpt_to=rcpt,
        received_at=rfc3339(now) or "",
        message_ref=rt.new_id(),
        trust=trust,
    )
    address = parse_address(rcpt, domains=list(config.domains))
    sha = hashlib.sha256(raw).hexdigest()
    return await store.write(lambda db: service.deliver(rt, db, address, mail, raw, sha, now))


async def open_case_through(lmtp: LmtpHandler, store: Store) -> str:
    """A new case through the LMTP edge's recording; its canonical address."""
    raw = (
        b"From: ann@example.org\r\nTo: ticket@help.example\r\nSubject: hi\r\n"
        b"Message-ID: <" + secrets.token_hex(8).encode() + b"@example.org>\r\n\r\nHello.\r\n"
    )
    replies = await lmtp.record(raw, "ann@example.org", ["ticket@help.example"])
    assert replies.startswith("250 "), replies
    cases = await store.read(
        lambda db: [r[0] for r in db.execute("SELECT address FROM cases ORDER BY rowid")]
    )
    return str(cases[-1])


async def handoff_of(store: Store, case_key: str) -> str:
    row = await store.read(
        lambda db: db.execute(
            "SELECT handoff_id FROM handoffs WHERE case_key = ? ORDER BY requested_at DESC",
            (case_key,),
        ).fetchone()
    )
    assert row is not None, f"no handoff on {case_key}"
    return str(row[0])


@dataclass
class Running:
    config: Config
    rt: service.Runtime
    store: Store
    clock: Clock
    metrics: Metrics
    server: HttpServer
    client: httpx.AsyncClient
    commits: list[int] = field(default_factory=list)
    edge: HttpEdge | None = None

    async def open_callback_case(self, subject: str = "Printer jams") -> tuple[str, str]:
        """A case opened by ``ticket!callback@help.example``: (case key, handoff id)."""
        got = await deliver(
            self.store, self.rt, "ticket!callback@help.example", self.clock.now(), subject=subject
        )
        return got.case_key, await handoff_of(self.store, got.case_key)


def status_message(
    case_key: str, handoff_id: str, seq: int, status: str, *, mid: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A ``handoff.status`` for a case whose canonical address equals its key."""
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": mid or f"st-{secrets.token_hex(6)}",
        "case": {"address": case_key, "key": case_key},
        "handoff_id": handoff_id,
        "seq": seq,
        "status": status,
        **extra,
    }


class _Commits:
    """A commit listener that counts the commits it is told of."""

    def __init__(self, commits: list[int]) -> None:
        self.commits = commits

    def committed(self, wakes: Any) -> None:
        self.commits.append(1)


@asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    admin: bool = True,
    listen: Listen | None = None,
    limits: HttpLimits | None = None,
    adjust: Callable[[str], str] | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Running]:
    """Start the HTTP edge on loopback port 0 (or ``listen``) over a fresh store.

    ``adjust``: rewrites the configuration's text before it is loaded; ``clock``: the
    edge's (a real one by default).
    """
    path = write_config(tmp_path, admin=admin)
    if adjust is not None:
        path.write_text(adjust(path.read_text()))
    config = load_config(path)
    rt = service.Runtime(config, new_id=lambda: secrets.token_hex(16))
    store = Store.open(config.server.database)
    clock = clock or Clock()
    metrics = Metrics()
    commits: list[int] = []
    edge = HttpEdge(EdgeContext(rt, store, clock, metrics, _Commits(commits)))
    server = await start_http(
        listen or TcpListen("127.0.0.1", 0), edge, limits=limits or HttpLimits()
    )
    try:
        first = server.addresses[0]
        if isinstance(first, tuple):
            transport = None
            base = f"http://{first[0]}:{first[1]}"
        else:
            transport = httpx.AsyncHTTPTransport(uds=first)
            base = "http://masd"
        async with httpx.AsyncClient(base_url=base, transport=transport, timeout=10) as client:
            yield Running(config, rt, store, clock, metrics, server, client, commits, edge)
    finally:
        await server.close()
        store.close()
