"""A master-role masd on real pieces, for the outbox, timer and DKIM tests.

A TOML config in tmp_path (loaded by ``masd.config.load_config``) whose
``ticket`` type has a ``callback`` endpoint at a FakePeer and whose relay is
an SmtpSink; a real Store; mail delivered through ``service.deliver`` as the
LMTP edge would.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlite_utils import Database

from masd import service
from masd.clock import Clock
from masd.config import Config, load_config
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.core.trust import TrustSettings
from masd.metrics import Metrics
from masd.service import Delivered, Runtime
from masd.store import Store
from masd.testing import FakePeer, SmtpSink

T = TypeVar("T")

CALLBACK_TOKEN = "callback-secret-5d1e0b7f"
CALLBACK_PEER = "mode:help.example/ticket/callback"


@dataclass
class Env:
    config: Config
    rt: Runtime
    store: Store
    clock: Clock
    metrics: Metrics
    peer: FakePeer
    sink: SmtpSink
    tmp: Path
    more_peers: dict[str, FakePeer] = field(default_factory=dict)

    def trust(self) -> TrustSettings:
        server = self.config.server
        return TrustSettings.of(server.trusted_authserv_ids, server.trusted_hosts)

    def reopen(self) -> Env:
        """The same store file and config, as a restarted masd would have them."""
        self.store.close()
        config = load_config(self.tmp / "masd.toml")
        return Env(
            config=config,
            rt=Runtime(config, new_id=lambda: secrets.token_hex(16)),
            store=Store.open(config.server.database),
            clock=self.clock,
            metrics=Metrics(),
            peer=self.peer,
            sink=self.sink,
            tmp=self.tmp,
            more_peers=self.more_peers,
        )

    async def close(self) -> None:
        self.store.close()
        await self.peer.close()
        for other in self.more_peers.values():
            await other.close()
        await self.sink.close()


def write_config(
    tmp: Path,
    *,
    peer_url: str,
    relay_port: int,
    deadline: str,
    dkim: bool,
    more_modes: Mapping[str, str] = {},
) -> Path:
    """The config; ``more_modes`` adds endpoints (mode name -> base URL) beside ``callback``."""
    token = tmp / "callback.token"
    token.write_text(CALLBACK_TOKEN + "\n")
    token.chmod(0o600)
    dkim_line = 'dkim = { selector = "mas", key_file = "dkim.key" }' if dkim else ""
    modes = json.dumps(["callback", *more_modes])
    endpoints = ""
    for mode, url in more_modes.items():
        (tmp / f"{mode}.token").write_text(f"{mode}-secret-{secrets.token_hex(8)}\n")
        (tmp / f"{mode}.token").chmod(0o600)
        endpoints += f"""
[domains."help.example".types.ticket.endpoints.{mode}]
url = "{url}mas"
token_file = "{mode}.token"
deadline = "{deadline}"
"""
    text = f"""
[server]
lmtp = "unix:{tmp}/lmtp.sock"
http = "127.0.0.1:8025"
database = "{tmp}/masd.db"
smtp_relay = "127.0.0.1:{relay_port}"
trusted_authserv_ids = ["mx.help.example"]
hostname = "masd.help.example"
retry_for = "1h"

[domains."help.example"]
{dkim_line}

[domains."help.example".types.ticket]
role = "master"
modes = {modes}
id_prefix = "gs-"

[domains."help.example".types.ticket.endpoints.callback]
url = "{peer_url}mas"
token_file = "callback.token"
deadline = "{deadline}"
fields = ["phone"]
{endpoints}"""
    path = tmp / "masd.toml"
    path.write_text(text)
    return path


async def make_env(
    tmp: Path,
    *,
    clock: Clock | None = None,
    peer: FakePeer | None = None,
    deadline: str = "1h",
    dkim: bool = False,
    more_peers: Mapping[str, FakePeer] = {},
) -> Env:
    """``more_peers``: more endpoints of ``ticket`` (mode name -> peer), started here."""
    peer = await (peer or FakePeer()).start()
    for other in more_peers.values():
        await other.start()
    sink = await SmtpSink().start()
    more_modes = {mode: p.url for mode, p in more_peers.items()}
    path = write_config(
        tmp,
        peer_url=peer.url,
        relay_port=sink.port,
        deadline=deadline,
        dkim=dkim,
        more_modes=more_modes,
    )
    config = load_config(path)
    return Env(
        config=config,
        rt=Runtime(config, new_id=lambda: secrets.token_hex(16)),
        store=Store.open(config.server.database),
        clock=clock or Clock(),
        metrics=Metrics(),
        peer=peer,
        sink=sink,
        tmp=tmp,
        more_peers=dict(more_peers),
    )


def run_env(tmp: Path, body: Callable[[Env], Awaitable[None]], **env_args: Any) -> None:
    """``body`` on a fresh :func:`make_env` (``env_args`` passed on), closed after it."""

    async def main() -> None:
        env = await make_env(tmp, **env_args)
        try:
            await body(env)
        finally:
            await env.close()

    asyncio.run(main())


def inbound(
    rcpt: str,
    *,
    sender: str = "alice@example.com",
    subject: str = "Please call me",
    body: str = "Hello,\r\nphone: +1 555 0100\r\n",
) -> tuple[bytes, str]:
    """A DMARC-passing mail as the trusted MTA hands it over; returns (raw, Message-ID)."""
    mid = f"<{secrets.token_hex(8)}@example.com>"
    raw = (
        "Authentication-Results: mx.help.example; dmarc=pass header.from=example.com\r\n"
        "Received: from mail.example.com by mx.help.example with ESMTPS; "
        "Tue, 5 Mar 2024 10:00:00 +0000\r\n"
        f"From: Alice <{sender}>\r\n"
        f"To: {rcpt}\r\n"
        f"Subject: {subject}\r\n"
        "Date: Tue, 5 Mar 2024 10:00:00 +0000\r\n"
        f"Message-ID: {mid}\r\n"
        "MIME-Version: 1.0\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        "\r\n"
        f"{body}"
    ).encode()
    return raw, mid


async def deliver(
    env: Env, rcpt: str, raw: bytes, *, sender: str = "alice@example.com"
) -> Delivered:
    """One recipient's copy of ``raw``, recorded as the LMTP edge records it."""
    address = parse_address(rcpt, domains=tuple(env.config.domains))
    now = env.clock.now()
    mail = build_event(
        raw,
        mail_from=sender,
        rcpt_to=rcpt,
        received_at=_rfc3339(now),
        message_ref=env.rt.new_id(),
        trust=env.trust(),
    )
    sha = hashlib.sha256(raw).hexdigest()
    return await env.store.write(
        lambda db: service.deliver(env.rt, db, address, mail, raw, sha, now)
    )


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows(db: Database, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    cur = db.execute(sql, params)
    names = [c[0] for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


async def query(env: Env, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    return await env.store.read(lambda db: rows(db, sql, params))


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                value = check()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g} s: {what}") from None
