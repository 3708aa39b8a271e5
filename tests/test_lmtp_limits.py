"""LMTP limits (docs/protocol.md §3): the session cap and the no-progress timeout, on loopback.

The listener runs in-process over a real store; its limits are injected
small so the tests are quick.  The flood test (marker ``fault``) uses the
configured default and prints its counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.ticket import write_ticket_config

from masd.config import TcpListen
from masd.edges.context import EdgeContext
from masd.edges.lmtp import MAX_SESSIONS, LmtpHandler, start_lmtp
from masd.metrics import Metrics
from masd.service import Runtime
from masd.store import Store
from masd.testing.lmtpclient import deliver

HOSTNAME = "lmtp.help.example"
WAIT = 10.0
MAIL = (
    b"From: Alice <alice@example.org>\r\nTo: ticket@help.example\r\nSubject: Printer\r\n"
    b"Message-ID: <lim-1@example.org>\r\n\r\nThe printer is on fire.\r\n"
)


@dataclass
class Listener:
    store: Store
    metrics: Metrics
    port: int

    async def messages(self) -> int:
        row = await self.store.read(
            lambda db: db.execute("SELECT COUNT(*) FROM messages").fetchone()
        )
        return int(row[0])

    async def session(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """A new connection and the first line the server wrote."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return reader, writer, await asyncio.wait_for(reader.readline(), WAIT)


@contextlib.asynccontextmanager
async def listening(tmp_path: Path, **limits: Any) -> AsyncIterator[Listener]:
    config = write_ticket_config(tmp_path, server=f'hostname = "{HOSTNAME}"')
    store = Store.open(config.server.database)
    metrics = Metrics()
    rt = Runtime(config, new_id=lambda: secrets.token_hex(16))
    handler = LmtpHandler(EdgeContext(rt, store, metrics=metrics))
    server = await start_lmtp(
        TcpListen("127.0.0.1", 0),
        handler,
        hostname=HOSTNAME,
        max_message_bytes=config.server.max_message_bytes,
        **limits,
    )
    try:
        yield Listener(store, metrics, server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()
        await handler.drain()
        store.close()


async def command(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: bytes) -> bytes:
    writer.write(line + b"\r\n")
    reply = await asyncio.wait_for(reader.readline(), WAIT)
    while reply[3:4] == b"-":
        reply = await asyncio.wait_for(reader.readline(), WAIT)
    return reply


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server wrote until it closed the connection (bounded wait)."""
    return await asyncio.wait_for(reader.read(), WAIT)


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()


# --------------------------------------------------------------------------- session cap


def test_sessions_over_the_cap_get_421_at_connect_then_close(tmp_path: Path) -> None:
    async def main() -> None:
        async with listening(tmp_path, max_sessions=3) as lmtp:
            admitted = [await lmtp.session() for _ in range(3)]
            assert all(greeting.startswith(b"220 ") for _, _, greeting in admitted)
            reader, writer, refused = await lmtp.session()
            assert refused.startswith(b"421 4.3.2 "), refused
            assert b"server.max_lmtp_sessions" in refused
            assert await closed_by_server(reader) == b""
            writer.close()
            assert lmtp.metrics.value("masd_connections_refused_total", listener="lmtp") == 1
            # The admitted sessions work; when one ends, a new one is admitted.
            r0, w0, _ = admitted[0]
            assert (await command(r0, w0, b"LHLO mx.help.example")).startswith(b"250 ")
            assert await command(r0, w0, b"QUIT") == b"221 2.0.0 Bye\r\n"
            await closed_by_server(r0)
            await asyncio.sleep(0.05)  # the server sees the close
            _, w4, greeting = await lmtp.session()
            assert greeting.startswith(b"220 "), greeting
            close_all([w for _, w, _ in admitted] + [w4])

    asyncio.run(main())


def test_a_delivery_after_a_refused_session_is_recorded(tmp_path: Path) -> None:
    async def main() -> None:
        async with listening(tmp_path, max_sessions=1) as lmtp:
            _, holder, _ = await lmtp.session()
            with pytest.raises(Exception, match="421"):
                await deliver(
                    ("127.0.0.1", lmtp.port), "a@example.org", ["ticket@help.example"], MAIL
                )
            holder.close()
            await asyncio.sleep(0.05)
            result = await deliver(
                ("127.0.0.1", lmtp.port), "a@example.org", ["ticket@help.example"], MAIL
            )
            assert result.codes == (250,)
            assert await lmtp.messages() == 1

    asyncio.run(main())


# --------------------------------------------------------------------------- long lines


#: A real Outlook reply's HTML part: one line of 1,523 characters.
OUTLOOK_LINE = (
    b'<div class="WordSection1"><p class="MsoNormal"><span style="font-size:11.0pt">'
    + b"Thanks, the printer on floor 3 works again. " * 32
).ljust(1523, b"x")


HTML_HEAD = (
    b"From: Alice <alice@example.org>\r\nTo: ticket@help.example\r\nSubject: Re: Printer\r\n"
    b"Message-ID: <lim-2@example.org>\r\nContent-Type: text/html; charset=us-ascii\r\n\r\n"
)


@pytest.mark.parametrize(
    "line", [OUTLOOK_LINE, bytes(range(33, 127)) * 1090], ids=["1523 octets", "100 KB"]
)
def test_a_long_line_in_the_data_is_recorded_byte_for_byte(tmp_path: Path, line: bytes) -> None:
    # docs/protocol.md §3: no mail is refused for its content; only the size limit holds.
    raw = HTML_HEAD + b"Hello,\r\n" + line + b"\r\n.leading dot\r\n"

    async def main() -> None:
        async with listening(tmp_path) as lmtp:
            result = await deliver(
                ("127.0.0.1", lmtp.port), "a@example.org", ["ticket@help.example"], raw
            )
            assert [(r.final.code, r.final.enhanced) for r in result.recipients] == [(250, "2.0.0")]
            (stored,) = await lmtp.store.read(
                lambda db: db.execute("SELECT raw FROM messages").fetchall()
            )
            assert stored[0] == raw
            assert lmtp.metrics.value("masd_deliveries_total", outcome="recorded") == 1

    assert len(line) in (1523, 102_460)
    asyncio.run(main())


def test_a_command_line_over_the_limit_is_still_refused(tmp_path: Path) -> None:
    # The limit of the dialogue itself (aiosmtpd's), unlike a line of the data.
    async def main() -> None:
        async with lmtp_session(tmp_path) as (reader, writer):
            long_path = b"MAIL FROM:<" + b"a" * 3000 + b"@example.org>"
            reply = await command(reader, writer, long_path)
            assert reply.startswith(b"500 5.5.2 "), reply
            assert b"too long" in reply
            assert (await command(reader, writer, b"NOOP")).startswith(b"250 ")

    asyncio.run(main())


@contextlib.asynccontextmanager
async def lmtp_session(
    tmp_path: Path,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    async with listening(tmp_path) as lmtp:
        reader, writer, greeting = await lmtp.session()
        assert greeting.startswith(b"220 ")
        assert (await command(reader, writer, b"LHLO mx.help.example")).startswith(b"250 ")
        try:
            yield reader, writer
        finally:
            writer.close()


# --------------------------------------------------------------------------- no progress


async def in_data(lmtp: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer, _ = await lmtp.session()
    assert (await command(reader, writer, b"LHLO mx.help.example")).startswith(b"250")
    assert (await command(reader, writer, b"MAIL FROM:<a@example.org>")).startswith(b"250")
    assert (await command(reader, writer, b"RCPT TO:<ticket@help.example>")).startswith(b"250")
    assert (await command(reader, writer, b"DATA")).startswith(b"354")
    return reader, writer


def test_a_session_stalled_inside_data_is_closed_and_nothing_is_recorded(tmp_path: Path) -> None:
    async def main() -> None:
        async with listening(tmp_path, idle_timeout=0.5) as lmtp:
            reader, writer = await in_data(lmtp)
            writer.write(MAIL[:40])  # part of the message, then nothing
            assert await closed_by_server(reader) == b""
            writer.close()
            await asyncio.sleep(0.1)
            assert await lmtp.messages() == 0

    asyncio.run(main())


def test_a_session_stalled_between_commands_is_closed_and_nothing_is_recorded(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with listening(tmp_path, idle_timeout=0.5) as lmtp:
            reader, writer, _ = await lmtp.session()
            assert (await command(reader, writer, b"LHLO mx")).startswith(b"250")
            assert (await command(reader, writer, b"MAIL FROM:<a@example.org>")).startswith(b"250")
            assert (await command(reader, writer, b"RCPT TO:<ticket@help.example>")).startswith(
                b"250"
            )
            writer.write(b"DA")  # half a command is no progress
            assert await closed_by_server(reader) == b""
            writer.close()
            assert await lmtp.messages() == 0

    asyncio.run(main())


def test_data_arriving_slowly_is_progress(tmp_path: Path) -> None:
    async def main() -> None:
        async with listening(tmp_path, idle_timeout=0.5) as lmtp:
            reader, writer = await in_data(lmtp)
            # Well over the idle timeout in all, but never silent that long.
            for start in range(0, len(MAIL), 8):
                writer.write(MAIL[start : start + 8])
                await writer.drain()
                await asyncio.sleep(0.1)
            writer.write(b".\r\n")
            reply = await asyncio.wait_for(reader.readline(), WAIT)
            assert reply.startswith(b"250 2.0.0 "), reply
            writer.close()
            assert await lmtp.messages() == 1

    asyncio.run(main())


# --------------------------------------------------------------------------- flood


@pytest.mark.fault
def test_500_idle_sessions_beyond_the_cap_get_421(tmp_path: Path) -> None:
    async def main() -> None:
        async with listening(tmp_path) as lmtp:
            sessions = await asyncio.gather(*(lmtp.session() for _ in range(500)))
            greetings = [g[:3] for _, _, g in sessions]
            admitted, refused = greetings.count(b"220"), greetings.count(b"421")
            print(
                f"\n500 idle LMTP sessions: {admitted} admitted, {refused} refused with 421 4.3.2"
            )
            assert (admitted, refused) == (MAX_SESSIONS, 500 - MAX_SESSIONS)
            still_open = [(r, w) for (r, w, g) in sessions if g.startswith(b"220")]
            close_all([w for _, w, _ in sessions])
            for reader, _ in still_open:
                await closed_by_server(reader)
            await asyncio.sleep(0.1)
            # Once they are gone, mail flows again.
            result = await deliver(
                ("127.0.0.1", lmtp.port), "a@example.org", ["ticket@help.example"], MAIL
            )
            assert result.codes == (250,)

    asyncio.run(main())
