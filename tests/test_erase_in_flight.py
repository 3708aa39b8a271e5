"""A send already under way when its case is erased is broken off (docs/protocol.md §16.11).

masd runs as a process; its relay is a real SMTP server on loopback that holds the
acknowledgement at ``DATA`` (the mail mid-SMTP: the relay has its envelope, not its data).
The case is erased meanwhile; the relay then invites the data, and finds the connection
closed before the end of it, so it has no mail to deliver (before, masd sent the data and
the acknowledgement of the erased case went out).  Nothing of the case is sent again.

Likewise a ``handoff.request`` whose mode endpoint holds its answer: once the case is
erased the request is given up, so the ``handoff.cancel`` the erase queued behind it on the
same queue goes out at once (before, it waited for the request's answer, here for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
from support.masd_process import WAIT, MasdProcess, mx_mail, write_master_config

from masd.testing import lmtpclient
from masd.testing.peers import Answer, FakePeer, Recorded, SmtpSink

ANN = "ann@example.org"
KEY = "ticket=ticket-1@help.example"


class HeldRelay:
    """An SMTP server that answers every command but holds ``DATA`` until released;
    ``outcome``: ``delivered`` (the data came whole) or ``broken off`` (the client left)."""

    def __init__(self) -> None:
        self.at_data = asyncio.Event()
        self.release = asyncio.Event()
        self.outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.sessions = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HeldRelay:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.sessions += 1
        try:
            await self._commands(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _commands(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 held.test ESMTP\r\n")
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while line := await reader.readline():
                verb = line[:4].upper()
                if verb == b"EHLO":
                    writer.write(b"250-held.test\r\n250 8BITMIME\r\n")
                elif verb == b"DATA":
                    self.at_data.set()
                    await self.release.wait()
                    try:
                        writer.write(b"354 go ahead\r\n")
                        await writer.drain()
                        await reader.readuntil(b"\r\n.\r\n")
                    except (asyncio.IncompleteReadError, ConnectionError):
                        # The client left: its close seen as an end of input, or, when the
                        # 354 reached a socket it had closed, as a reset.
                        self.outcome.set_result("broken off")
                        return
                    self.outcome.set_result("delivered")
                    writer.write(b"250 2.0.0 queued\r\n")
                elif verb == b"QUIT":
                    writer.write(b"221 bye\r\n")
                    break
                else:
                    writer.write(b"250 ok\r\n")
                await writer.drain()


def test_an_acknowledgement_mid_smtp_is_broken_off_when_its_case_is_erased(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with FakePeer() as endpoint, HeldRelay() as relay:
            setup = write_master_config(
                tmp_path / "masd", endpoint_url=endpoint.url + "cb", smtp_port=relay.port
            )
            async with (
                MasdProcess(setup.config, tmp_path / "masd.log") as masd,
                httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT) as http,
            ):
                _, data = mx_mail(ANN, "ticket@help.example", subject="Help")
                result = await lmtpclient.deliver(
                    ("127.0.0.1", setup.lmtp_port), ANN, ["ticket@help.example"], data
                )
                assert result.codes == (250,), result
                await asyncio.wait_for(relay.at_data.wait(), WAIT)  # the ack is mid-SMTP
                erased = await http.post(
                    f"/mas/v0.1/cases/{KEY}/erase",
                    headers={"Authorization": f"Bearer {setup.admin_token}"},
                )
                assert erased.status_code == 200, erased.text
                relay.release.set()
                outcome = await asyncio.wait_for(relay.outcome, WAIT)
                assert outcome == "broken off", masd.log()
                assert "its case was erased" in masd.log()
                assert await masd.terminate() == 0
            assert relay.sessions == 1  # nothing of the case was sent again

    asyncio.run(main())


def test_a_request_held_by_its_mode_is_given_up_when_its_case_is_erased(tmp_path: Path) -> None:
    never = asyncio.Event()

    async def hold(rec: Recorded) -> Answer:
        if rec.json is not None and rec.json.get("type") == "handoff.request":
            await never.wait()  # the mode never answers
        return 200, {"ok": True}

    async def main() -> None:
        async with FakePeer(hold) as endpoint, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path / "masd", endpoint_url=endpoint.url + "cb", smtp_port=sink.port
            )
            text = setup.config.read_text().replace("[server]\n", '[server]\npeer_timeout = "1h"\n')
            setup.config.write_text(text)
            async with (
                MasdProcess(setup.config, tmp_path / "masd.log") as masd,
                httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT) as http,
            ):
                rcpt = "ticket!callback@help.example"
                _, data = mx_mail(ANN, rcpt, subject="Call me")
                result = await lmtpclient.deliver(("127.0.0.1", setup.lmtp_port), ANN, [rcpt], data)
                assert result.codes == (250,), result
                (request,) = await endpoint.wait_for(1, WAIT)
                assert request.json is not None
                assert request.json["type"] == "handoff.request"
                erased = await http.post(
                    f"/mas/v0.1/cases/{KEY}/erase",
                    headers={"Authorization": f"Bearer {setup.admin_token}"},
                )
                assert erased.status_code == 200, erased.text
                received = await endpoint.wait_for(2, WAIT)
                cancel = received[1].json
                assert cancel is not None
                assert (cancel["type"], cancel["reason"]) == ("handoff.cancel", "erased")
                assert "its case was erased" in masd.log()
                never.set()
                assert await masd.terminate() == 0

    asyncio.run(main())
