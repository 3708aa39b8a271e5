"""A running masd with a reader of every kind, for the read side's black-box tests
(docs/protocol.md §16.8-§16.10).

The slave configuration of :func:`support.slave.write_slave_config` (type ``case`` of
help.example under "the CRM", type ``order`` of help.example and ``case`` of
other.example under "the other master", a transfers webhook), plus a master-role type
``ticket`` with a ``callback`` mode endpoint.  Both masters are :class:`FakePeer`
servers, so every ``case.intake`` is answered 200.  :class:`Readers` holds a secret of
each kind: the admin, each master, the mode endpoint, the webhook, and one nobody has.
"""

from __future__ import annotations

import email.policy
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx

from masd.testing import lmtpclient
from masd.testing.inbound import mx_trace
from masd.testing.peers import FakePeer, SmtpSink
from support.masd_process import WAIT, MasdProcess, wait_until, write_secret
from support.slave import SlaveSetup, write_slave_config

ANN = "ann@example.org"


@dataclass
class Readers:
    setup: SlaveSetup
    masd: MasdProcess
    crm: FakePeer
    other: FakePeer
    http: httpx.AsyncClient  # no secret of its own: each call says whose
    mode_token: str

    @property
    def tokens(self) -> dict[str, str | None]:
        """A secret of each kind of caller, by name (None: no Authorization at all)."""
        return {
            "admin": self.setup.admin_token,
            "crm": self.setup.master_token,
            "other": self.setup.other_master_token,
            "mode": self.mode_token,
            "webhook": self.setup.webhook_token,
            "unknown": "nobody-" + "0" * 32,
            "none": None,
        }

    async def get(self, path: str, who: str, **kw: Any) -> httpx.Response:
        token = self.tokens[who]
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return await self.http.get(path, headers=headers, **kw)

    async def deliver(self, rcpt: str, data: bytes, sender: str = ANN) -> None:
        result = await lmtpclient.deliver(
            ("127.0.0.1", self.setup.lmtp_port), sender, [rcpt], data, timeout=max(WAIT, 120)
        )
        assert result.codes == (250,), result

    async def intake(self, peer: FakePeer, rcpt: str, data: bytes) -> dict[str, Any]:
        """Deliver ``data`` to an intake address; the case.intake ``peer`` got for it."""
        before = len(peer.requests)
        await self.deliver(rcpt, data)
        await wait_until(lambda: len(peer.requests) > before, "case.intake")
        message = peer.requests[-1].json
        assert message is not None
        assert message["type"] == "case.intake", message
        return message

    async def assign(self, token: str, intake_ref: str, resource_id: str) -> None:
        message = {
            "mas_modes_version": "0.1",
            "type": "case.assign",
            "id": secrets.token_hex(16),
            "intake_ref": intake_ref,
            "resource_id": resource_id,
        }
        response = await self.http.post(
            "/mas/v0.1/messages", json=message, headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 200, response.text


def attached(
    rcpt: str,
    subject: str,
    data: bytes = b"%PDF-1.4 tiny\n",
    *,
    filename: str = "a.pdf",
    ctype: str = "application/pdf",
    cte: str | None = None,
) -> bytes:
    """A mail with our MX's trace, a text part and one attachment of ``data``."""
    msg = EmailMessage(policy=email.policy.SMTP)
    for header, value in mx_trace("example.org"):
        msg[header] = value
    msg["From"] = ANN
    msg["To"] = rcpt
    msg["Subject"] = subject
    msg["Message-ID"] = f"<{secrets.token_hex(8)}@example.org>"
    msg.set_content("See the file.\n")
    maintype, subtype = ctype.split("/")
    extra = {} if cte is None else {"cte": cte}
    msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename, **extra)
    return msg.as_bytes()


@asynccontextmanager
async def running(tmp_path: Path, *, server: str = "") -> AsyncIterator[Readers]:
    """masd with both masters, a webhook and a mode endpoint; ``server``: lines added to
    its ``[server]`` table."""
    async with FakePeer() as crm, FakePeer() as other, FakePeer() as hook, SmtpSink() as sink:
        setup = write_slave_config(
            tmp_path / "masd",
            master_url=crm.url + "crm",
            other_master_url=other.url + "other",
            webhook_url=hook.url + "hooks/",
            smtp_port=sink.port,
        )
        mode_token = "mode-" + secrets.token_hex(16)
        write_secret(setup.config.parent / "secrets" / "mode.token", mode_token)
        text = setup.config.read_text().replace("[server]\n", "[server]\n" + server, 1)
        setup.config.write_text(
            text
            + """
[domains."help.example".types.ticket]
role = "master"
modes = ["callback"]

[domains."help.example".types.ticket.endpoints.callback]
url = "http://127.0.0.1:9/callback"
token_file = "secrets/mode.token"
deadline = "2h"
"""
        )
        async with (
            MasdProcess(setup.config, tmp_path / "masd.log") as masd,
            httpx.AsyncClient(base_url=setup.http_url, timeout=max(WAIT, 60)) as http,
        ):
            yield Readers(setup, masd, crm, other, http, mode_token)
            if masd.running:
                code = await masd.terminate()
                assert code == 0, masd.log()
