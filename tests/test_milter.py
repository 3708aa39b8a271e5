"""The milter listener on real sockets, asked by clients that are not masd's code.

Two clients: ``miltertest`` (OpenDKIM's libmilter-compatible test client,
scripted in Lua, from Debian) plays an MTA through whole SMTP transactions;
:class:`RawMta` writes the milter wire format by hand (a 4-octet length, a
command letter, NUL-ended strings) so the exact reply bytes can be read.
A real Store in tmp_path; cases are created through the LMTP edge's own
recording, so the answers are checked against what masd really stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.bounces import bounce_address_of
from support.http import open_case_through
from support.masd_process import free_port
from support.system import require_program
from support.ticket import write_ticket_config

from masd.app import App
from masd.config import Config, TcpListen, UnixListen
from masd.edges.context import EdgeContext
from masd.edges.lmtp import LmtpHandler
from masd.edges.milter import METRIC, MilterListenError, MilterServer, start_milter
from masd.metrics import Metrics
from masd.service import Runtime
from masd.store import Store

WAIT = 10.0
MAX_BYTES = 4000


def write_config(directory: Path, listeners: str = "") -> Config:
    return write_ticket_config(directory, server=f"max_message_bytes = {MAX_BYTES}\n{listeners}")


# --------------------------------------------------------------------------- a hand-written MTA


def frame(command: bytes, *strings: bytes) -> bytes:
    data = command + b"".join(s + b"\0" for s in strings)
    return struct.pack("!L", len(data)) + data


class RawMta:
    """The MTA's side of the milter protocol, written out by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read(self) -> tuple[bytes, bytes]:
        """The next frame from masd: (command letter, data)."""
        async with asyncio.timeout(WAIT):
            (size,) = struct.unpack("!L", await self.reader.readexactly(4))
            data = await self.reader.readexactly(size)
        return data[:1], data[1:]

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def start(self) -> tuple[int, int, int]:
        """Negotiate: offer version 6, every action and every protocol option."""
        payload = b"O" + struct.pack("!LLL", 6, 0x1FF, 0x001FFFFF)
        await self.send(struct.pack("!L", len(payload)) + payload)
        command, data = await self.read()
        assert command == b"O", (command, data)
        version, actions, steps = struct.unpack("!LLL", data[:12])
        return version, actions, steps

    async def ask(self, command: bytes, *strings: bytes) -> tuple[bytes, bytes]:
        await self.send(frame(command, *strings))
        return await self.read()

    async def at_eof(self) -> bool:
        try:
            async with asyncio.timeout(WAIT):
                return await self.reader.read() == b""
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@dataclass
class Rig:
    config: Config
    store: Store
    metrics: Metrics
    server: MilterServer
    lmtp: LmtpHandler

    @property
    def port(self) -> int:
        (address,) = self.server.addresses
        assert isinstance(address, tuple)
        return int(address[1])

    @contextlib.asynccontextmanager
    async def mta(self) -> AsyncIterator[RawMta]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        mta = RawMta(reader, writer)
        try:
            yield mta
        finally:
            await mta.close()

    async def open_case(self) -> str:
        return await open_case_through(self.lmtp, self.store)


@contextlib.asynccontextmanager
async def rig(
    tmp_path: Path, listen: TcpListen | UnixListen | None = None, *, cap: int = 100
) -> AsyncIterator[Rig]:
    config = write_config(tmp_path)
    store = await asyncio.to_thread(Store.open, tmp_path / "masd.db")
    metrics = Metrics()
    rt = Runtime(config, lambda: secrets.token_hex(16))
    ctx = EdgeContext(rt, store, metrics=metrics)
    lmtp = LmtpHandler(ctx)
    server = await start_milter(
        listen or TcpListen("127.0.0.1", 0), MilterServer(ctx), max_connections=cap
    )
    try:
        yield Rig(config, store, metrics, server, lmtp)
    finally:
        await server.close()
        await asyncio.to_thread(store.close)


# --------------------------------------------------------------------------- the wire, by hand


def test_recipient_answers_are_the_lmtp_edge_answers(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            case = await r.open_case()
            async with r.mta() as mta:
                version, actions, steps = await mta.start()
                assert version == 6
                assert actions == 0  # masd never changes a message
                assert steps & 0x3 == 0x3  # no connect, no helo events wanted
                assert await mta.ask(b"M", b"<ann@example.org>") == (b"c", b"")
                assert await mta.ask(b"R", f"<{case}>".encode()) == (b"c", b"")
                assert await mta.ask(b"R", b"<ticket@help.example>") == (b"c", b"")
                assert await mta.ask(b"R", b"<ann@elsewhere.example>") == (b"c", b"")
                assert await mta.ask(b"R", b"<ticket=ticket-7@help.example>") == (
                    b"y",
                    b"550 5.1.1 id: no case ticket=ticket-7@help.example\0",
                )
                assert await mta.ask(b"R", b"<nosuch@help.example>") == (
                    b"y",
                    b"550 5.1.1 type: no type 'nosuch' at help.example\0",
                )
            assert r.metrics.value(METRIC, stage="rcpt", outcome="unknown-case") == 1

    asyncio.run(main())


def test_a_bounce_address_needs_a_tag_that_verifies(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            case = await r.open_case()
            ack = await bounce_address_of(r.store, case)
            local, _, domain = case.partition("@")
            async with r.mta() as mta:
                await mta.start()
                assert await mta.ask(b"M", b"<>") == (b"c", b"")
                assert await mta.ask(b"R", f"<{ack}>".encode()) == (b"c", b"")
                forged = f"<{local}+bounce-1-aaaaaaaaaaaaaaaa@{domain}>".encode()
                assert await mta.ask(b"R", forged) == (
                    b"y",
                    f"550 5.1.1 bounce address of {case}: tag does not verify\0".encode(),
                )

    asyncio.run(main())


def test_store_unavailable_is_a_temporary_refusal(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            case = await r.open_case()
            await asyncio.to_thread(r.store.close)
            async with r.mta() as mta:
                await mta.start()
                assert await mta.ask(b"M", b"<ann@example.org>") == (b"c", b"")
                assert await mta.ask(b"R", f"<{case}>".encode()) == (
                    b"y",
                    b"451 4.3.0 store unavailable, try again later\0",
                )
                # An intake address needs no store: still accepted.
                assert await mta.ask(b"R", b"<ticket@help.example>") == (b"c", b"")

    asyncio.run(main())


def test_message_over_the_limit_refused_at_end_of_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r, r.mta() as mta:
            await mta.start()
            for body, expected in ((b"x" * (MAX_BYTES + 1), b"y"), (b"Hello.\r\n", b"c")):
                assert await mta.ask(b"M", b"<ann@example.org>") == (b"c", b"")
                assert await mta.ask(b"R", b"<ticket@help.example>") == (b"c", b"")
                # Header and body events need no answer (masd asked for none).
                await mta.send(frame(b"L", b"Subject", b"hi"))
                await mta.send(struct.pack("!L", len(body) + 1) + b"B" + body)
                command, data = await mta.ask(b"E")
                assert command == expected, (command, data)
                if expected == b"y":
                    assert data.startswith(b"552 5.3.4 message of "), data
            # The body's last piece may come with end of data itself.
            assert await mta.ask(b"M", b"<ann@example.org>") == (b"c", b"")
            assert await mta.ask(b"R", b"<ticket@help.example>") == (b"c", b"")
            last = b"x" * (MAX_BYTES + 1)
            await mta.send(struct.pack("!L", len(last) + 1) + b"E" + last)
            command, data = await mta.read()
            assert (command, data[:10]) == (b"y", b"552 5.3.4 ")
            assert r.metrics.value(METRIC, stage="eom", outcome="too-big") == 2

    asyncio.run(main())


def test_protocol_errors_close_the_connection_not_the_listener(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            async with r.mta() as mta:
                await mta.start()
                await mta.send(b"\x00\x00\x00\x01Z")  # an unknown command
                assert await mta.at_eof()
            async with r.mta() as mta:
                await mta.start()
                await mta.send(struct.pack("!L", 1 << 30) + b"B")  # larger than any buffer
                assert await mta.at_eof()
            async with r.mta() as mta:  # still listening
                await mta.start()
                assert await mta.ask(b"R", b"<ticket@help.example>") == (b"c", b"")

    asyncio.run(main())


def test_connections_over_the_cap_are_closed_unanswered(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, cap=2) as r, r.mta() as one, r.mta() as two:
            for mta in (one, two):
                await mta.start()
            async with r.mta() as third:
                assert await third.at_eof()
            assert r.metrics.value("masd_connections_refused_total", listener="milter") == 1
            assert await two.ask(b"R", b"<ticket@help.example>") == (b"c", b"")
            await one.close()
            await asyncio.sleep(0.05)
            async with r.mta() as again:  # under the cap again
                await again.start()

    asyncio.run(main())


def _negotiate(version: int, data: bytes | None = None) -> bytes:
    payload = b"O" + (struct.pack("!LLL", version, 0x1FF, 0x1FFFFF) if data is None else data)
    return struct.pack("!L", len(payload)) + payload


#: First frames masd closes the connection on, and what its warning says.
BAD_OPENINGS = (
    (_negotiate(6, b"\x00\x00\x00\x06"), "a negotiation of 4 octets, not 12"),
    (_negotiate(6, b""), "a negotiation of 0 octets"),
    (frame(b"R", b"<ticket@help.example>"), "command b'R' before negotiation"),
    (frame(b"C", b"client", b"4"), "command b'C' before negotiation"),
    (b"\x00\x00\x00\x00", "an empty frame"),
    (_negotiate(0), "protocol version 0; masd needs 2 or later"),
    (_negotiate(1), "protocol version 1"),
)


def test_a_malformed_or_early_frame_closes_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A short negotiation, a command before negotiation, a version below 2: the
    connection is closed unanswered, with one warning and no traceback."""

    async def main() -> None:
        async with rig(tmp_path) as r:
            for opening, why in BAD_OPENINGS:
                caplog.clear()
                async with r.mta() as mta:
                    await mta.send(opening)
                    assert await mta.at_eof(), why
                await asyncio.sleep(0.05)  # the server's side logs as it closes
                warnings = [rec for rec in caplog.records if rec.name == "masd.milter"]
                assert len(warnings) == 1, (why, [w.getMessage() for w in warnings])
                assert warnings[0].levelname == "WARNING"
                assert why in warnings[0].getMessage()
                assert warnings[0].exc_info is None
            async with r.mta() as mta:  # version 2 is answered with version 2
                await mta.send(_negotiate(2))
                command, data = await mta.read()
                assert (command, struct.unpack("!L", data[:4])[0]) == (b"O", 2)

    with caplog.at_level(logging.INFO):
        asyncio.run(main())


def test_a_short_frame_after_negotiation_is_a_warning_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r, r.mta() as mta:
            await mta.start()
            await mta.send(_negotiate(6, b"\x00\x01"))  # negotiating again, cut short
            assert await mta.at_eof()
            await asyncio.sleep(0.05)

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    lines = [r for r in caplog.records if r.name == "masd.milter"]
    assert [r.levelname for r in lines] == ["WARNING"], [r.getMessage() for r in lines]
    assert lines[0].exc_info is None


def test_unix_socket_and_listen_errors(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "milter.sock"
        async with rig(tmp_path, UnixListen(path)) as r:
            assert oct(path.stat().st_mode & 0o777) == oct(0o660)
            reader, writer = await asyncio.open_unix_connection(str(path))
            mta = RawMta(reader, writer)
            await mta.start()
            assert await mta.ask(b"R", b"<nosuch@help.example>") == (
                b"y",
                b"550 5.1.1 type: no type 'nosuch' at help.example\0",
            )
            await mta.close()
            with socket.socket() as busy:
                busy.bind(("127.0.0.1", 0))
                busy.listen()
                port = busy.getsockname()[1]
                with pytest.raises(MilterListenError, match="cannot listen on"):
                    await start_milter(TcpListen("127.0.0.1", port), r.server)

    asyncio.run(main())


def test_app_runs_the_milter_listener_when_configured(tmp_path: Path) -> None:
    async def main() -> None:
        lmtp, http, milter = free_port(), free_port(), free_port()
        listeners = f'lmtp = "127.0.0.1:{lmtp}"\nhttp = "127.0.0.1:{http}"\n'
        app = App(write_config(tmp_path, listeners + f'milter = "127.0.0.1:{milter}"'), sockets={})
        listening = await app.start()
        try:
            assert listening.milter is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", milter)
            mta = RawMta(reader, writer)
            await mta.start()
            assert (await mta.ask(b"R", b"<ticket=ticket-1@help.example>"))[0] == b"y"
            await app.stop()
            assert await mta.at_eof()  # stopping closed the open connection
            await mta.close()
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", milter)
        finally:
            await app.stop()
        other = tmp_path / "other"
        other.mkdir()
        app = App(write_config(other, listeners), sockets={})
        try:
            assert (await app.start()).milter is None
        finally:
            await app.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- miltertest

MILTERTEST = """\
local conn = mt.connect("inet:{port}@127.0.0.1", 10, 0.2)
if conn == nil then error("cannot connect") end
local function expect(what, reply, want)
  if reply ~= nil then error(what .. " failed: " .. tostring(reply)) end
  if mt.getreply(conn) ~= want then error(what .. ": unexpected reply") end
  mt.echo(what .. " ok")
end
-- masd asks for no connect and helo events: mt.mailfrom skips them
expect("mail", mt.mailfrom(conn, "<ann@example.org>"), SMFIR_CONTINUE)
expect("rcpt case", mt.rcptto(conn, "<{case}>"), SMFIR_CONTINUE)
expect("rcpt intake", mt.rcptto(conn, "<ticket@help.example>"), SMFIR_CONTINUE)
expect("rcpt unknown case", mt.rcptto(conn, "<ticket=ticket-9@help.example>"), SMFIR_REPLYCODE)
expect("rcpt unknown type", mt.rcptto(conn, "<nosuch@help.example>"), SMFIR_REPLYCODE)
expect("rcpt other domain", mt.rcptto(conn, "<bob@elsewhere.example>"), SMFIR_CONTINUE)
mt.header(conn, "From", "ann@example.org")
mt.header(conn, "Subject", "a large one")
mt.bodystring(conn, string.rep("0123456789abcdef\\r\\n", {lines}))
expect("eom over the limit", mt.eom(conn), SMFIR_REPLYCODE)
mt.disconnect(conn)
"""


def test_miltertest_plays_an_mta_against_masd(tmp_path: Path) -> None:
    miltertest = require_program("miltertest")

    async def main() -> None:
        async with rig(tmp_path) as r:
            case = await r.open_case()
            script = tmp_path / "masd.lua"
            lines = MAX_BYTES // 18 + 1
            script.write_text(MILTERTEST.format(port=r.port, case=case, lines=lines))
            done = await asyncio.to_thread(
                subprocess.run,
                [miltertest, "-v", "-s", str(script)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            output = done.stdout + done.stderr
            assert done.returncode == 0, output
            for step in ("rcpt unknown case ok", "rcpt other domain ok", "eom over the limit ok"):
                assert step in output, output
            assert r.metrics.value(METRIC, stage="rcpt", outcome="unknown-type") == 1

    asyncio.run(main())
