"""The demo's rig: masd in this process, its peers and the mail sink, on loopback.

masd is :class:`masd.app.App` with a configuration written to a temporary
directory; the relay is a :class:`~masd.testing.peers.SmtpSink`; the peers
are the demo's callback services and CRM (:mod:`masd.demo.peers`).  The
story drives it with :meth:`DemoRig.deliver` (mail over LMTP, as Postfix
would) and waits with :meth:`DemoRig.wait_mails` and :meth:`DemoRig.wait_for`.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO, TypeVar

from masd.app import App
from masd.config import Config, load_config
from masd.demo.peers import CallbackService, Crm
from masd.demo.stage import Stage
from masd.read.case_views import open_work
from masd.store import Tx
from masd.testing import lmtpclient
from masd.testing.client import MasdClient
from masd.testing.config import DOMAIN, server_table, write_config
from masd.testing.net import free_port
from masd.testing.peers import ReceivedMail, SmtpSink
from masd.testing.wait import poll

__all__ = ["SETTLE_SECONDS", "DemoRig"]

T = TypeVar("T")

#: How long the demo waits for every flow of a part to settle before it reports failure.
SETTLE_SECONDS: Final = 20.0
#: Tries at binding the HTTP listener (its port is chosen before masd binds it).
_BIND_TRIES: Final = 3


class DemoRig:
    """One run of the demo: masd, the peers, the sink, and what went wrong."""

    def __init__(self, out: TextIO, directory: Path) -> None:
        self.stage = Stage(out)
        self.directory = directory
        self.sink = SmtpSink(hostname="sink.demo", on_mail=self._mail_out)
        self.callback = CallbackService(self.stage, secrets.token_hex(24))
        # The slave part's peers: an outside master and the service its transfers reach.
        self.crm = Crm(self.stage, secrets.token_hex(24))
        self.transfer = CallbackService(self.stage, secrets.token_hex(24))
        self.app: App | None = None
        self.config: Config | None = None
        self.config_path = directory / "masd.toml"
        self.lmtp_port = 0
        self.problems: list[str] = []
        self.until = 0.0

    # ---- set-up

    async def start(self) -> None:
        await self.sink.start()
        for peer in (self.callback, self.crm, self.transfer):
            await peer.start()
        self.crm.transfer_url = self.transfer.url
        last_error: OSError | None = None
        for _ in range(_BIND_TRIES):  # the free HTTP port may be taken before masd binds it
            self.config = load_config(self._write_config(free_port()))
            app = App(self.config)
            try:
                listening = await app.start()
            except OSError as exc:
                last_error = exc
                await app.stop()
                continue
            self.app = app
            sockets: Sequence[socket.socket] = getattr(listening.lmtp, "sockets", None) or []
            self.lmtp_port = int(sockets[0].getsockname()[1])
            for peer in (self.callback, self.crm, self.transfer):
                peer.masd = MasdClient(self.config.server.public_url)
            self.stage.idle = self.idle
            return
        raise RuntimeError(f"masd could not bind its HTTP listener: {last_error}")

    def _write_config(self, http_port: int) -> Path:
        """masd.toml: type ``ticket`` (master, modes callback and chat) and type
        ``case`` (slave, owned by the CRM, transfers may go to the callback service)."""
        ticket = {
            "role": "master",
            "modes": ["callback", "chat"],  # chat is enabled but has no endpoint
            "endpoints": {
                "callback": {
                    "url": self.callback.url,
                    "token_file": "secrets/callback.token",
                    "deadline": "1h",
                    "fields": ["phone", "time"],
                }
            },
        }
        case = {
            "role": "slave",
            "master": {"url": self.crm.url, "token_file": "secrets/crm.token"},
            "policy": {"autonomous_send": False, "transfers": "block"},
            "webhooks": [
                {
                    "url": self.transfer.url,
                    "token_file": "secrets/transfer.token",
                    "fields": ["phone"],
                }
            ],
        }
        server = server_table(lmtp_port=0, http_port=http_port, smtp_port=self.sink.port)
        doc = {"server": server, "domains": {DOMAIN: {"types": {"ticket": ticket, "case": case}}}}
        tokens = {
            "admin": secrets.token_hex(24),
            "callback": self.callback.token,
            "crm": self.crm.token,
            "transfer": self.transfer.token,
        }
        return write_config(self.directory, doc, tokens)

    async def stop(self) -> None:
        for peer in (self.callback, self.crm, self.transfer):
            await peer.stop()
        if self.app is not None:
            await self.app.stop()
        for peer in (self.callback, self.crm, self.transfer):
            if peer.masd is not None:
                await peer.masd.aclose()
        await self.sink.close()

    # ---- what happens

    def _mail_out(self, mail: ReceivedMail) -> None:
        message = mail.message
        auto = message.get("Auto-Submitted")
        part = message.get_body(("plain",))
        body = "" if part is None else str(part.get_content())
        quoted = [f"  > {x}" for x in body.strip().splitlines() if x.strip()][:4]
        self.stage.effect(
            "mail out",
            f"From {message['From']}  To {message['To']}"
            + (f"  (Auto-Submitted: {auto})" if auto else ""),
            f"Subject: {message['Subject']}",
            *quoted,
        )

    async def deliver(self, rcpt: str, mail_from: str, data: bytes) -> bool:
        """Deliver over LMTP (inside an act); print masd's reply to the recipient."""
        try:
            result = await lmtpclient.deliver(
                ("127.0.0.1", self.lmtp_port), mail_from, [rcpt], data
            )
        except lmtpclient.LmtpError as exc:
            self.stage.event("LMTP", f"delivery to {rcpt} failed: {exc}")
            self.problems.append(f"LMTP delivery to {rcpt} failed: {exc}")
            return False
        reply = result.recipients[0].final
        self.stage.event(
            "LMTP", f"RCPT {rcpt}: {reply.code} {reply.lines[0] if reply.lines else ''}"
        )
        if reply.code != 250:
            self.problems.append(f"LMTP refused the mail to {rcpt}: {reply}")
            return False
        return True

    # ---- waiting and reading

    def begin(self) -> None:
        """Start the clock of a part: every wait of it ends by :data:`SETTLE_SECONDS`."""
        self.problems = []
        self.until = asyncio.get_running_loop().time() + SETTLE_SECONDS

    def time_left(self) -> float:
        """Seconds until the part's waits end."""
        return max(0.0, self.until - asyncio.get_running_loop().time())

    async def wait_mails(self, address: str, count: int, what: str) -> bool:
        """Until ``count`` mails have reached ``address``; a problem if they do not."""
        if await self.sink.wait_until(
            lambda: len(self.sink.to(address)) >= count, self.time_left()
        ):
            return True
        self.problems.append(f"{what}: no mail reached {address} in time")
        return False

    async def wait_for(self, test: Callable[[Tx], bool], what: str) -> bool:
        """Until ``test`` holds on masd's record; a problem if it does not."""
        if await poll(lambda: self.read(test), within=self.time_left()):
            return True
        self.problems.append(f"{what}: did not happen in time")
        return False

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """``fn`` on one snapshot of masd's store (a read-side job)."""
        assert self.app is not None
        assert self.app.store is not None
        return await self.app.store.read(fn)

    async def idle(self) -> bool:
        """masd has nothing left to send."""
        return not (await self.read(open_work))["outbox"]

    def describe(self) -> list[str]:
        """Where everything listens, for the opening lines."""
        assert self.config is not None
        return [
            f"  masd          LMTP 127.0.0.1:{self.lmtp_port} (where Postfix would deliver),",
            f"                HTTP {self.config.server.http} (mode endpoints post statuses here)",
            f"  callback      a demo mode endpoint at {self.callback.url}",
            f"  mail out      an SMTP sink at 127.0.0.1:{self.sink.port},"
            " standing in for the relay",
            f"  config        {self.config_path}",
        ]
