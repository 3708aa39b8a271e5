"""The SMTP transport against a real SMTP server on loopback (masd.testing.SmtpSink).

Between masd and the sink sits a TCP relay of the test's own that counts
connections and can swallow traffic, so a test can see how many sessions
carried the mail and make the relay hang.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from masd.config import TcpListen
from masd.edges.mailer import OutboundMail, SmtpResult
from masd.edges.smtp import SmtpTransport
from masd.testing import SmtpSink

FROM = "ticket=gs-1@help.example"


def mail(n: int, to: str = "alice@example.com", body: bytes = b"hello\r\n") -> OutboundMail:
    message = (
        f"From: <{FROM}>\r\nTo: <{to}>\r\nSubject: Re: {n}\r\n"
        f"Message-ID: <r{n}@help.example>\r\n\r\n"
    ).encode() + body
    return OutboundMail(FROM, to, message, "help.example")


class Tap:
    """A TCP forwarder to ``target`` that counts connections; ``hang`` stops forwarding."""

    def __init__(self, target: TcpListen) -> None:
        self.target = target
        self.connections = 0
        self.hang = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def relay(self) -> TcpListen:
        assert self._server is not None
        return TcpListen("127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def start(self) -> Tap:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        for writer in self._writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target.host, self.target.port)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if not self.hang:
                    writer.write(data)
        writer.close()


@contextlib.asynccontextmanager
async def relay() -> AsyncIterator[tuple[SmtpSink, Tap]]:
    sink = await SmtpSink().start()
    tap = await Tap(sink.relay).start()
    try:
        yield sink, tap
    finally:
        await tap.close()
        await sink.close()


def test_many_mails_go_over_few_kept_sessions() -> None:
    async def main() -> None:
        async with relay() as (sink, tap):
            transport = SmtpTransport(tap.relay, hostname="masd.test", keys={}, connections=3)
            results = await asyncio.gather(*(transport.send(mail(n)) for n in range(60)))
            assert [r.outcome for r in results] == ["ok"] * 60
            assert results[0].code == 250
            # Later mail reuses the sessions (the probe RSET after an idle pause too).
            for n in range(60, 70):
                assert (await transport.send(mail(n))).ok
            await transport.close()
            arrived = sorted(
                int(m.raw.split(b"Subject: Re: ")[1].split(b"\r\n")[0]) for m in sink.messages
            )
            assert arrived == list(range(70))
            assert 1 <= tap.connections <= 3

    asyncio.run(main())


def test_refusals_are_per_message_and_the_session_is_kept() -> None:
    async def main() -> None:
        async with relay() as (sink, tap):
            transport = SmtpTransport(tap.relay, hostname="masd.test", keys={}, connections=1)
            assert (await transport.send(mail(0))).ok
            outcomes: list[SmtpResult] = []
            for reply, at in [
                ("550 5.1.1 no such user", "RCPT"),
                ("452 4.2.2 mailbox full", "RCPT"),
                ("554 5.7.1 spam", "DATA"),
                ("451 4.3.0 try later", "DATA"),
            ]:
                sink.refuse(reply, at=at)  # type: ignore[arg-type]
                outcomes.append(await transport.send(mail(len(outcomes) + 1)))
                assert (await transport.send(mail(100 + len(outcomes)))).ok
            await transport.close()
            assert [(r.outcome, r.describe()) for r in outcomes] == [
                ("permanent", "SMTP 550 5.1.1 no such user"),
                ("temporary", "SMTP 452 4.2.2 mailbox full"),
                ("permanent", "SMTP 554 5.7.1 spam"),
                ("temporary", "SMTP 451 4.3.0 try later"),
            ]
            assert len(sink.messages) == 5
            assert tap.connections == 1

    asyncio.run(main())


def test_a_relay_restart_mid_stream_loses_and_doubles_nothing() -> None:
    async def main() -> None:
        sink = await SmtpSink().start()
        transport = SmtpTransport(sink.relay, hostname="masd.test", keys={}, connections=2)
        try:
            first = await asyncio.gather(*(transport.send(mail(n)) for n in range(10)))
            await sink.close()  # every session dropped, nothing listens
            down = await transport.send(mail(10))
            assert down.outcome == "temporary"
            assert down.code is None
            assert "refused" in down.text.lower()
            await sink.set_down(False)  # up again on the same port
            second = await asyncio.gather(*(transport.send(mail(n)) for n in range(11, 30)))
            assert all(r.ok for r in first + second)
            subjects = [m.raw.split(b"Subject: ")[1].split(b"\r\n")[0] for m in sink.messages]
            assert sorted(subjects) == sorted(
                f"Re: {n}".encode() for n in [*range(10), *range(11, 30)]
            )
        finally:
            await transport.close()
            await sink.close()

    asyncio.run(main())


def test_sessions_dropped_while_idle_are_replaced_without_a_failure() -> None:
    async def main() -> None:
        async with relay() as (sink, tap):
            transport = SmtpTransport(tap.relay, hostname="masd.test", keys={}, connections=2)
            assert all(
                r.ok for r in await asyncio.gather(transport.send(mail(0)), transport.send(mail(1)))
            )
            for writer in tap._writers:  # the relay closes idle sessions (timeout, restart)
                writer.close()
            await asyncio.sleep(0.05)
            assert (await transport.send(mail(2))).ok
            await transport.close()
            assert len(sink.messages) == 3

    asyncio.run(main())


def test_a_relay_that_hangs_times_out_and_a_new_session_recovers() -> None:
    async def main() -> None:
        async with relay() as (sink, tap):
            transport = SmtpTransport(
                tap.relay, hostname="masd.test", keys={}, connections=1, timeout=0.5
            )
            assert (await transport.send(mail(0))).ok
            tap.hang = True
            hung = await transport.send(mail(1))
            assert hung.outcome == "temporary"
            assert "relay 127.0.0.1:" in hung.text
            assert "timed out" in hung.text.lower()
            tap.hang = False
            assert (await transport.send(mail(2))).ok
            await transport.close()
            assert [m.raw.split(b"Subject: ")[1][:5] for m in sink.messages] == [b"Re: 0", b"Re: 2"]
            assert tap.connections == 2

    asyncio.run(main())


def test_a_relay_silent_from_the_start_times_out() -> None:
    async def main() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # and never greets

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = SmtpTransport(
            TcpListen("127.0.0.1", port), hostname="masd.test", keys={}, timeout=0.3
        )
        result = await transport.send(mail(0))
        await transport.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
        assert result.outcome == "temporary"
        assert result.text.startswith(f"relay 127.0.0.1:{port}: ")

    asyncio.run(main())


def test_smtputf8_and_8bitmime_as_the_message_needs() -> None:
    async def main() -> None:
        async with SmtpSink() as sink:
            transport = SmtpTransport(sink.relay, hostname="masd.test", keys={})
            utf8 = await transport.send(mail(0, to="jörg@exämple.com"))
            eight = await transport.send(mail(1, body="Grüße\r\n".encode()))
            plain = await transport.send(mail(2))
            await transport.close()
            assert [utf8.ok, eight.ok, plain.ok] == [True, True, True]
            options = [tuple(o.upper() for o in m.mail_options) for m in sink.messages]
            assert sink.messages[0].rcpt_tos == ("jörg@exämple.com",)
            assert "SMTPUTF8" in options[0]
            assert "BODY=8BITMIME" in options[1]
            assert options[2] == ()

    asyncio.run(main())


@pytest.mark.parametrize("address", ["bad\r\nRCPT TO:<x@y>", "x@y>\x00", "<x@y>"])
def test_an_address_that_cannot_be_sent_is_refused_for_good(address: str) -> None:
    async def main() -> None:
        async with relay() as (sink, tap):
            transport = SmtpTransport(tap.relay, hostname="masd.test", keys={}, connections=1)
            result = await transport.send(mail(0, to=address))
            assert result.outcome == "permanent"
            assert "address not sendable" in result.text
            assert (await transport.send(mail(1))).ok
            await transport.close()
            assert len(sink.messages) == 1
            assert tap.connections == 1

    asyncio.run(main())
