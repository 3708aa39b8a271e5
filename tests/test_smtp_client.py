"""masd's SMTP client session (masd.edges.smtp_client) against scripted servers on loopback.

Each server is a real socket that writes the replies a test gives it, as it
chooses to write them (together, a byte at a time, late or never), and
records what the client wrote."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from masd.config import TcpListen
from masd.edges.mailer import OutboundMail
from masd.edges.smtp import SmtpTransport
from masd.edges.smtp_client import Disconnected, ProtocolError, Reply, Session, Timeout
from masd.testing import SmtpSink

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(script: Script) -> AsyncIterator[int]:
    """A server on loopback running ``script`` for each connection; at the end, every
    connection is closed and its script let finish."""
    tasks: list[asyncio.Task[None]] = []
    writers: list[asyncio.StreamWriter] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await script(reader, writer)
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        tasks.append(asyncio.ensure_future(run(reader, writer)))

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield listening.sockets[0].getsockname()[1]
    finally:
        listening.close()
        for writer in writers:
            writer.close()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await listening.wait_closed()


def test_replies_written_together_are_each_read_in_order() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 ready\r\n")
        for _ in range(3):
            await reader.readline()
        writer.write(b"250 sender ok\r\n550 5.1.1 no such user\r\n554 no valid recipients\r\n")
        await reader.read()

    async def main() -> list[Reply]:
        async with server(script) as port:
            session, greeting = await Session.open("127.0.0.1", port, timeout=5)
            assert greeting == Reply(220, "ready")
            replies = await session.commands([b"MAIL FROM:<a@b>", b"RCPT TO:<c@d>", b"DATA"])
            session.close()
            return replies

    assert asyncio.run(main()) == [
        Reply(250, "sender ok"),
        Reply(550, "5.1.1 no such user"),
        Reply(554, "no valid recipients"),
    ]


def test_a_reply_over_many_lines_and_many_packets_is_one_reply() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 ready\r\n")
        await reader.readline()
        for byte in b"250-relay.test\r\n250-PIPELINING\r\n250-8bitmime\n250 SMTPUTF8 \r\n":
            writer.write(bytes([byte]))
            await writer.drain()
        await reader.read()

    async def main() -> Session:
        async with server(script) as port:
            session, _ = await Session.open("127.0.0.1", port, timeout=5)
            reply = await session.hello("masd.test")
            assert reply == Reply(250, "relay.test\nPIPELINING\n8bitmime\nSMTPUTF8")
            session.close()
            return session

    session = asyncio.run(main())
    assert session.extensions == {"PIPELINING", "8BITMIME", "SMTPUTF8"}
    assert session.supports("8bitmime")


@pytest.mark.parametrize(
    ("written", "error"),
    [
        (b"220 ready\r\nhello there\r\n", ProtocolError),
        (b"220 ready\r\n25 short\r\n", ProtocolError),
        (b"220 ready\r\n" + b"250-" + b"x" * 70_000, ProtocolError),
        (b"220 ready\r\n" + b"250-many\r\n" * 10_000, ProtocolError),
        (b"220 ready\r\n", Disconnected),  # then the server closes
    ],
)
def test_what_is_not_smtp_or_a_closed_connection_ends_the_session(
    written: bytes, error: type[Exception]
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(written)
        await writer.drain()
        await reader.readline()  # the NOOP, or the end; then the connection is closed

    async def main() -> Session:
        async with server(script) as port:
            session, _ = await Session.open("127.0.0.1", port, timeout=5)
            with pytest.raises(error):
                await session.command(b"NOOP")
            await asyncio.sleep(0)
            return session

    assert not asyncio.run(main()).is_connected


def test_a_reply_that_does_not_come_times_out_and_ends_the_session() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 ready\r\n")
        await reader.readline()
        await asyncio.sleep(0.5)
        writer.write(b"250 late\r\n")  # would be taken for the next command's reply
        await reader.read()

    async def main() -> None:
        async with server(script) as port:
            session, _ = await Session.open("127.0.0.1", port, timeout=0.1)
            with pytest.raises(Timeout, match=r"timed out waiting 0\.1 s for the reply to NOOP"):
                await session.command(b"NOOP")
            assert not session.is_connected
            with pytest.raises(Disconnected):
                await session.command(b"NOOP")

    asyncio.run(main())


def test_the_message_is_sent_dot_stuffed_with_crlf_and_ended() -> None:
    got: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 ready\r\n354 go on\r\n")  # a 354 for the test to take as given
        got.append(await reader.readuntil(b"\r\n.\r\n"))
        writer.write(b"250 queued\r\n")
        await reader.read()

    async def main() -> Reply:
        async with server(script) as port:
            session, _ = await Session.open("127.0.0.1", port, timeout=5)
            assert (await session._read(1, "354"))[0].code == 354
            reply = await session.message(b"Subject: x\n\n.one\r\nline\r..two\nend")
            session.close()
            return reply

    assert asyncio.run(main()) == Reply(250, "queued")
    assert got == [b"Subject: x\r\n\r\n..one\r\nline\r\n...two\r\nend\r\n.\r\n"]


# -- the transport's transaction, pipelined or not ------------------------------------


def _relay_script(pipelining: bool, overlapped: list[bool]) -> Script:
    """A relay that answers each command only after looking whether the next one came
    before its reply was written (only a pipelining client can have sent it)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 relay\r\n")
        await reader.readline()  # EHLO
        offered = b"250-relay\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
        writer.write(offered if pipelining else b"250-relay\r\n250 8BITMIME\r\n")
        line = await reader.readline()
        while line:
            verb = line.split(b" ", 1)[0].strip().upper()
            await asyncio.sleep(0.05)
            try:
                following = await asyncio.wait_for(reader.readline(), 0.01)
                overlapped.append(True)
            except TimeoutError:
                following = None
                if verb in (b"MAIL", b"RCPT"):
                    overlapped.append(False)
            writer.write(b"354 go on\r\n" if verb == b"DATA" else b"250 ok\r\n")
            if verb == b"DATA":
                await reader.readuntil(b"\r\n.\r\n")
                writer.write(b"250 queued\r\n")
            line = following if following is not None else await reader.readline()

    return script


@pytest.mark.parametrize("pipelining", [True, False])
def test_the_transport_pipelines_only_where_the_relay_offers_it(pipelining: bool) -> None:
    overlapped: list[bool] = []

    async def main() -> bool:
        async with server(_relay_script(pipelining, overlapped)) as port:
            transport = SmtpTransport(TcpListen("127.0.0.1", port), hostname="masd.test", keys={})
            mail = OutboundMail("a@help.example", "b@example.com", b"Subject: x\r\n\r\nhi\r\n", "d")
            result = await transport.send(mail)
            await transport.close()
            return result.ok

    assert asyncio.run(main())
    assert overlapped == ([True, True] if pipelining else [False, False])


def test_a_pipelined_refusal_is_the_first_one_and_the_session_is_kept() -> None:
    async def main() -> None:
        async with SmtpSink() as sink:
            transport = SmtpTransport(sink.relay, hostname="masd.test", keys={}, connections=1)
            ok = OutboundMail("a@help.example", "b@example.com", b"Subject: x\r\n\r\nhi\r\n", "d")
            sink.refuse("550 5.1.1 no such user", at="RCPT")
            refused = await transport.send(ok)
            assert (refused.outcome, refused.describe()) == (
                "permanent",
                "SMTP 550 5.1.1 no such user",
            )
            assert (await transport.send(ok)).ok
            await transport.close()
            assert len(sink.messages) == 1

    asyncio.run(main())
