"""Automated mail over LMTP, black-box (docs/protocol.md §4): recorded, never answered, never
handed off.

masd runs as a real process; mail goes in over LMTP from a DMARC-passing
sender asking for a callback.  List traffic (``List-Id``) and a sender whose
client asks for no automatic answer (``X-Auto-Response-Suppress``) get no
acknowledgement and no handoff; the thread records the refusal
(tests/test_trust.py checks the reason each header gives).  A plain mail
from the same sender afterwards is acknowledged and handed off, so the sink
and the endpoint were listening.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from support.masd_process import WAIT, MasdProcess, mx_mail, write_master_config

from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, SmtpSink

ANN = "ann@example.org"

AUTOMATED = [
    {"List-Id": "Help users <help-users.lists.example.org>"},
    {"X-Auto-Response-Suppress": "All"},
    {"X-Auto-Response-Suppress": "DR, OOF, AutoReply"},
]


async def thread(http: httpx.AsyncClient, n: int) -> list[dict[str, Any]]:
    address = quote(f"ticket=ticket-{n}@help.example", safe="")
    response = await http.get(f"/mas/v0.1/cases/{address}/thread", params={"limit": 1000})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["entries"]
    return entries


@pytest.mark.slow
@pytest.mark.parametrize("headers", AUTOMATED)
def test_automated_mail_is_not_acknowledged_nor_handed_off(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    asyncio.run(_automated(tmp_path, headers))


async def _automated(tmp_path: Path, headers: dict[str, str]) -> None:
    async with FakePeer() as endpoint, SmtpSink() as sink:
        setup = write_master_config(
            tmp_path / "masd", endpoint_url=endpoint.url + "mas", smtp_port=sink.port
        )
        lmtp = ("127.0.0.1", setup.lmtp_port)
        async with (
            MasdProcess(setup.config, tmp_path / "masd.log") as masd,
            httpx.AsyncClient(
                base_url=setup.http_url,
                headers={"Authorization": f"Bearer {setup.admin_token}"},
                timeout=WAIT,
            ) as http,
        ):
            rcpt = "ticket!callback@help.example"
            _, data = mx_mail(ANN, rcpt, body="phone: +1 555 0100\n", headers=headers)
            result = await lmtpclient.deliver(lmtp, ANN, [rcpt], data, timeout=WAIT)
            assert result.codes == (250,), result  # recorded: automated mail is kept

            entries = await thread(http, 1)
            (mail_in,) = [e for e in entries if e["kind"] == "mail.in"]
            assert mail_in["automated"] is True, mail_in
            refused = [e["reason"] for e in entries if e["kind"] == "mail.refused"]
            assert refused == ["automated-sender"]
            statuses = [(e["status"], e.get("reason")) for e in entries if e["kind"] == "status"]
            assert statuses == [("requested", None), ("refused", "blocked")]
            assert not [e for e in entries if e["kind"] == "mail.out"]

            # The same sender without the header: acknowledged and handed off.
            _, plain = mx_mail(ANN, rcpt, body="phone: +1 555 0100\n")
            again = await lmtpclient.deliver(lmtp, ANN, [rcpt], plain, timeout=WAIT)
            assert again.codes == (250,), again
            (request,) = await endpoint.wait_for(1, WAIT)
            assert request.json["type"] == "handoff.request"
            assert request.json["case"]["address"] == "ticket=ticket-2@help.example"
            (ack,) = await sink.wait_for(1, WAIT)
            assert ack.rcpt_tos == (ANN,)
            assert "ticket-2" in str(ack.message["From"])
            assert len(endpoint.requests) == 1
            assert len(sink.messages) == 1
            await masd.terminate()
