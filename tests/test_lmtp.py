"""The LMTP edge and the LMTP client: real sessions on loopback sockets.

The listener is wired to a real Store in tmp_path and a Runtime from a real
config file; the outbox is not running, so only the LMTP replies and what
the store recorded are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.ticket import write_ticket_config

from masd.clock import Clock
from masd.config import Config, TcpListen, UnixListen
from masd.edges.context import EdgeContext
from masd.edges.lmtp import (
    LmtpHandler,
    LmtpListenError,
    new_message_ref,
    received_at,
    start_lmtp,
)
from masd.metrics import Metrics
from masd.service import Runtime
from masd.store import Store
from masd.testing.lmtpclient import LmtpConnection, LmtpError, LmtpResult, deliver, encode_data

HOSTNAME = "lmtp.help.example"
LIMIT = 20_000

SLAVE_TYPE = """
[domains."help.example".types.crm]
role = "slave"
master = { url = "http://127.0.0.1:9/mas/master", token_file = "master.token" }
"""


def write_config(tmp_path: Path, limit: int = LIMIT) -> Config:
    return write_ticket_config(
        tmp_path,
        server=f'max_message_bytes = {limit}\nhostname = "{HOSTNAME}"',
        types=SLAVE_TYPE,
        tokens=("callback.token", "master.token"),
    )


class _Commits:
    """A commit listener that counts the commits it is told of."""

    def __init__(self, commits: list[int]) -> None:
        self.commits = commits

    def committed(self, wakes: Any) -> None:
        self.commits.append(1)


@dataclass
class Rig:
    config: Config
    store: Store
    handler: LmtpHandler
    metrics: Metrics
    server: asyncio.Server
    target: str | tuple[str, int]
    commits: list[int] = field(default_factory=list)

    async def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return await self.store.read(lambda db: list(db.execute(sql, params).fetchall()))

    async def connect(self) -> LmtpConnection:
        return await LmtpConnection.open(self.target, lhlo="mx.help.example", timeout=10)

    def count(self, outcome: str) -> float:
        return self.metrics.value("masd_deliveries_total", outcome=outcome)


@contextlib.asynccontextmanager
async def running(tmp_path: Path, *, unix: bool = False, limit: int = LIMIT) -> AsyncIterator[Rig]:
    config = write_config(tmp_path, limit)
    store = Store.open(config.server.database)
    rt = Runtime(config, new_id=lambda: secrets.token_hex(16))
    metrics = Metrics()
    commits: list[int] = []
    handler = LmtpHandler(EdgeContext(rt, store, Clock(), metrics, _Commits(commits)))
    listen: TcpListen | UnixListen
    listen = UnixListen(tmp_path / "lmtp.sock") if unix else TcpListen("127.0.0.1", 0)
    server = await start_lmtp(
        listen, handler, hostname=config.server.hostname, max_message_bytes=limit
    )
    target: str | tuple[str, int]
    if unix:
        target = str(tmp_path / "lmtp.sock")
    else:
        target = ("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        yield Rig(config, store, handler, metrics, server, target, commits)
    finally:
        server.close()
        await server.wait_closed()
        await handler.drain()
        assert handler.in_flight == 0
        store.close()


def run(tmp_path: Path, body: Callable[[Rig], Awaitable[None]], **kwargs: Any) -> None:
    async def main() -> None:
        async with running(tmp_path, **kwargs) as rig:
            await body(rig)

    asyncio.run(main())


def mail(
    subject: str = "Printer on fire",
    message_id: str | None = "<a1@example.org>",
    body: str = "The printer on floor 3 is on fire.\r\n",
    sender: str = "Alice <alice@example.org>",
) -> bytes:
    head = [f"From: {sender}", "To: ticket@help.example", f"Subject: {subject}"]
    head.append("Date: Mon, 03 Jun 2024 10:00:00 +0000")
    if message_id is not None:
        head.append(f"Message-ID: {message_id}")
    return ("\r\n".join(head) + "\r\n\r\n" + body).encode()


def lines(result: LmtpResult) -> list[str]:
    return [str(r.final) for r in result.recipients]


# --------------------------------------------------------------------------- intake and replies


def test_single_intake_is_recorded_as_a_new_case(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        result = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], mail())
        assert result.mail.code == 250
        assert result.mail.enhanced == "2.1.0"
        (rcpt,) = result.recipients
        assert rcpt.rcpt.code == 250
        assert rcpt.rcpt.enhanced == "2.1.5"
        assert rcpt.data is not None
        assert rcpt.data.code == 250
        assert rcpt.data.enhanced == "2.0.0"
        ref = rcpt.data.text.split()[1]
        assert ref.startswith("msg-")
        assert len(ref) == 4 + 32
        assert rcpt.data.text == f"2.0.0 {ref} recorded"
        assert await rig.rows("SELECT key, participant FROM cases") == [
            ("ticket=ticket-1@help.example", "alice@example.org")
        ]
        stored = await rig.rows(
            "SELECT message_ref, case_key, rcpt_to, mail_from, raw FROM messages"
        )
        assert stored == [
            (
                ref,
                "ticket=ticket-1@help.example",
                "ticket@help.example",
                "alice@example.org",
                mail(),
            )
        ]
        assert rig.count("recorded") == 1
        assert rig.commits == [1]

    run(tmp_path, body)


def test_replies_to_pipelined_commands_go_out_in_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that writes MAIL, RCPT and DATA together (Postfix's LMTP client does, RFC
    2920) gets their three replies in one write; one that waits for each reply gets it."""
    written: list[tuple[int, bytes]] = []
    write = asyncio.StreamWriter.write

    def counted(self: asyncio.StreamWriter, data: bytes) -> None:  # type: ignore[override]
        written.append((id(self), bytes(data)))
        write(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", counted)

    async def body(rig: Rig) -> None:
        assert isinstance(rig.target, tuple)
        reader, writer = await asyncio.open_connection(*rig.target)

        async def replies(n: int) -> list[bytes]:
            got: list[bytes] = []
            while len(got) < n:
                line = await asyncio.wait_for(reader.readline(), 10)
                if line[3:4] != b"-":
                    got.append(line[:3])
            return got

        await replies(1)
        writer.write(b"LHLO mx.help.example\r\n")
        await replies(1)
        del written[:]
        envelope = b"MAIL FROM:<alice@example.org>\r\nRCPT TO:<ticket@help.example>\r\nDATA\r\n"
        writer.write(envelope)
        assert await replies(3) == [b"250", b"250", b"354"]
        ours = [data for who, data in written if who != id(writer)]
        assert len(ours) == 1  # one write, the three replies
        writer.write(encode_data(mail()))
        assert await replies(1) == [b"250"]
        writer.write(b"RSET\r\n")  # alone: answered alone, at once
        assert await replies(1) == [b"250"]
        writer.write(b"QUIT\r\n")
        assert await replies(1) == [b"221"]
        writer.close()

    run(tmp_path, body)


def test_multi_recipient_gets_one_reply_per_recipient_in_order(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        first = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], mail())
        assert first.codes == (250,)
        rcpts = [
            "ticket@help.example",  # a new intake
            "ticket@elsewhere.example",  # domain not configured
            "ticket=a..b@help.example",  # id does not parse
            "nosuch@help.example",  # unknown type
            "ticket=ticket-99@help.example",  # no such case
            "TICKET=Ticket-1@Help.Example",  # a reply to the case: equivalence key
            "crm@help.example",  # slave-role intake: reported to its master
        ]
        result = await deliver(
            rig.target, "bob@example.org", rcpts, mail(message_id="<b2@example.org>")
        )
        rcpt_codes = [(r.rcpt.code, r.rcpt.enhanced) for r in result.recipients]
        assert rcpt_codes == [
            (250, "2.1.5"),
            (550, "5.1.2"),
            (550, "5.1.1"),
            (550, "5.1.1"),
            (550, "5.1.1"),
            (250, "2.1.5"),
            (250, "2.1.5"),
        ]
        r = result.recipients
        assert "elsewhere.example" in r[1].rcpt.text
        assert "not a domain configured" in r[1].rcpt.text
        assert "id" in r[2].rcpt.text
        assert "nosuch" in r[3].rcpt.text
        assert "ticket=ticket-99@help.example" in r[4].rcpt.text
        # After DATA: one reply for each of the two accepted recipients, in RCPT order.
        assert [x.data is None for x in r] == [False, True, True, True, True, False, False]
        assert result.codes == (250, 550, 550, 550, 550, 250, 250)
        assert r[0].data is not None
        assert r[5].data is not None
        assert r[0].data.text.endswith(" recorded")
        assert r[5].data.text.endswith(" recorded")
        cases = await rig.rows("SELECT key FROM cases ORDER BY key")
        assert cases == [("ticket=ticket-1@help.example",), ("ticket=ticket-2@help.example",)]
        by_case = await rig.rows(
            "SELECT case_key, rcpt_to FROM messages WHERE mail_from = 'bob@example.org' "
            "ORDER BY case_key"
        )
        assert by_case == [
            (None, "crm@help.example"),  # a pending intake has no case yet
            ("ticket=ticket-1@help.example", "TICKET=Ticket-1@Help.Example"),
            ("ticket=ticket-2@help.example", "ticket@help.example"),
        ]
        assert rig.count("unknown-domain") == 1
        assert rig.count("bad-address") == 1
        assert rig.count("unknown-type") == 1
        assert rig.count("unknown-case") == 1
        assert rig.count("recorded") == 4
        intakes = await rig.rows("SELECT type, case_key FROM intakes")
        assert intakes == [("crm", None)]

    run(tmp_path, body)


def test_same_message_twice_is_recorded_once(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        raw = mail(message_id="<twice@example.org>")
        one = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], raw)
        two = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], raw)
        assert one.codes == two.codes == (250,)
        first, again = one.recipients[0].data, two.recipients[0].data
        assert first is not None
        assert again is not None
        ref = first.text.split()[1]
        assert again.text == f"2.0.0 {ref} already recorded"
        assert await rig.rows("SELECT message_ref FROM messages") == [(ref,)]
        assert len(await rig.rows("SELECT key FROM cases")) == 1
        assert rig.count("duplicate") == 1

    run(tmp_path, body)


def test_null_sender_is_accepted(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        raw = mail(subject="Delivery Status Notification", sender="MAILER-DAEMON@example.org")
        result = await deliver(rig.target, "<>", ["ticket@help.example"], raw)
        assert result.mail.code == 250
        assert result.codes == (250,)
        ((mail_from, event),) = await rig.rows("SELECT mail_from, event FROM messages")
        assert mail_from == ""
        assert '"mail_from": ""' in event or '"mail_from":""' in event

    run(tmp_path, body)


def test_smtputf8_sender(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        raw = mail(sender="José <josé@exemple.example>")
        result = await deliver(rig.target, "josé@exemple.example", ["ticket@help.example"], raw)
        assert result.codes == (250,)
        assert await rig.rows("SELECT mail_from FROM messages") == [("josé@exemple.example",)]

    run(tmp_path, body)


def test_dot_stuffing_and_line_ends_round_trip(tmp_path: Path) -> None:
    text = "line one\n.leading dot\n..two dots\n.\nlast line without end"
    raw = mail(body=text).replace(b"\r\n", b"\n")

    async def body(rig: Rig) -> None:
        result = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], raw)
        assert result.codes == (250,)
        ((stored,),) = await rig.rows("SELECT raw FROM messages")
        assert stored == raw.replace(b"\n", b"\r\n") + b"\r\n"

    run(tmp_path, body)


# --------------------------------------------------------------------------- limits and faults


def test_over_max_message_bytes_gets_552_per_recipient(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            big = mail(body=("y" * 70 + "\r\n") * 400)
            result = await conn.send(
                "alice@example.org", ["ticket@help.example", "ticket@help.example"], big
            )
            assert [r.rcpt.code for r in result.recipients] == [250, 250]
            assert [str(r.final) for r in result.recipients] == [
                f"552 5.3.4 message over {LIMIT} octets (server.max_message_bytes)"
            ] * 2
            # The session goes on: the next message on it is recorded.
            small = await conn.send("alice@example.org", ["ticket@help.example"], mail())
            assert small.codes == (250,)
        assert len(await rig.rows("SELECT 1 FROM messages")) == 1
        assert rig.count("too-big") == 2

    run(tmp_path, body)


def test_declared_size_over_the_limit_is_refused_at_mail(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            reply = await conn.command(f"MAIL FROM:<alice@example.org> SIZE={LIMIT + 1}")
            assert reply.code == 552
            assert reply.enhanced == "5.3.4"

    run(tmp_path, body)


def test_a_line_over_1000_octets_is_recorded_for_each_recipient(tmp_path: Path) -> None:
    # docs/protocol.md §3: no mail is refused for its content, a long line included.
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            raw = mail(body="z" * 3000 + "\r\n")
            result = await conn.send(
                "alice@example.org", ["ticket@help.example", "ticket@help.example"], raw
            )
            assert [(r.final.code, r.final.enhanced) for r in result.recipients] == [
                (250, "2.0.0"),
                (250, "2.0.0"),
            ]
            assert (await conn.command("NOOP")).code == 250
        stored = await rig.rows("SELECT raw FROM messages")
        assert stored == [(raw,)]  # one recipient named twice: one mail, one case

    run(tmp_path, body)


def test_store_fault_at_data_is_451_per_recipient_and_session_survives(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        first = await deliver(rig.target, "alice@example.org", ["ticket@help.example"], mail())
        assert first.codes == (250,)
        db = sqlite3.connect(rig.store.path)
        try:
            db.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON messages "
                "BEGIN SELECT RAISE(ABORT, 'simulated disk fault'); END"
            )
            db.commit()
            async with await rig.connect() as conn:
                rcpts = ["ticket@help.example", "ticket=ticket-1@help.example"]
                raw = mail(message_id="<fault@example.org>")
                failed = await conn.send("bob@example.org", rcpts, raw)
                assert [r.rcpt.code for r in failed.recipients] == [250, 250]
                assert [(r.final.code, r.final.enhanced) for r in failed.recipients] == [
                    (451, "4.3.0"),
                    (451, "4.3.0"),
                ]
                db.execute("DROP TRIGGER refuse")
                db.commit()
                again = await conn.send("bob@example.org", rcpts, raw)
                assert again.codes == (250, 250)
        finally:
            db.close()
        assert len(await rig.rows("SELECT 1 FROM messages")) == 3
        assert rig.count("fault") == 2

    run(tmp_path, body)


def test_closed_store_is_451_at_rcpt_and_data(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        assert (await deliver(rig.target, "a@example.org", ["ticket@help.example"], mail())).codes
        rig.store.close()
        async with await rig.connect() as conn:
            result = await conn.send(
                "a@example.org",
                ["ticket=ticket-1@help.example", "ticket@help.example"],
                mail(message_id="<closed@example.org>"),
            )
            rcpt, intake = result.recipients
            assert (rcpt.rcpt.code, rcpt.rcpt.enhanced) == (451, "4.3.0")
            assert intake.rcpt.code == 250  # an intake needs no lookup at RCPT
            assert (intake.final.code, intake.final.enhanced) == (451, "4.3.0")
            assert (await conn.command("NOOP")).code == 250

    run(tmp_path, body)


# --------------------------------------------------------------------------- protocol


def test_lhlo_advertises_pipelining_enhancedstatuscodes_size(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            assert conn.greeting.code == 220
            assert conn.greeting.text.startswith(HOSTNAME)
            assert conn.lhlo.lines[0] == HOSTNAME
            assert {"PIPELINING", "ENHANCEDSTATUSCODES", "SIZE", "8BITMIME", "SMTPUTF8"} <= (
                conn.extensions
            )
            assert f"SIZE {LIMIT}" in conn.lhlo.lines
            # HELO and EHLO are not LMTP; aiosmtpd's own replies get enhanced codes too.
            helo = await conn.command("EHLO mx.help.example")
            assert helo.code == 500
            assert helo.enhanced is not None
            early = await conn.command("RCPT TO:<ticket@help.example>")
            assert (early.code, early.enhanced) == (503, "5.5.1")
            assert (await conn.command("RSET")).enhanced == "2.0.0"

    run(tmp_path, body)


def test_pipelined_commands_are_answered_in_order(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        assert isinstance(rig.target, tuple)
        reader, writer = await asyncio.open_connection(*rig.target)
        try:

            async def reply() -> str:
                text = ""
                while True:
                    line = (await reader.readline()).decode()
                    text += line
                    if line[3:4] != "-":
                        return text

            assert (await reply()).startswith("220 ")
            writer.write(
                b"LHLO mx.help.example\r\nMAIL FROM:<a@example.org>\r\n"
                b"RCPT TO:<ticket@help.example>\r\nRCPT TO:<ticket@nowhere.example>\r\n"
                b"RCPT TO:<ticket@help.example>\r\nDATA\r\n"
            )
            got = [(await reply())[:9] for _ in range(6)]
            assert got == [
                "250-lmtp.",
                "250 2.1.0",
                "250 2.1.5",
                "550 5.1.2",
                "250 2.1.5",
                "354 End d",
            ]
            writer.write(encode_data(mail()) + b"QUIT\r\n")
            after = [await reply() for _ in range(3)]
            assert [x[:9] for x in after] == ["250 2.0.0", "250 2.0.0", "221 2.0.0"]
            assert after[0].endswith(" recorded\r\n")
            assert after[1].endswith(" recorded\r\n")
        finally:
            writer.close()
            await writer.wait_closed()

    run(tmp_path, body)


def test_addresses_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            await conn.write(b"MAIL FROM:<\xff\xfe@example.org>\r\n")
            sender = await conn.read_reply()
            assert (sender.code, sender.enhanced) == (501, "5.1.7")
            assert (await conn.command("MAIL FROM:<a@example.org>")).code == 250
            await conn.write(b"RCPT TO:<ticket=\xff@help.example>\r\n")
            rcpt = await conn.read_reply()
            assert (rcpt.code, rcpt.enhanced) == (550, "5.1.1")
            assert rcpt.text.isascii()

    run(tmp_path, body)


def test_data_without_accepted_recipient_is_one_503(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        async with await rig.connect() as conn:
            assert (await conn.command("MAIL FROM:<a@example.org>")).code == 250
            assert (await conn.command("RCPT TO:<ticket@nowhere.example>")).code == 550
            data = await conn.command("DATA")
            assert (data.code, data.enhanced) == (503, "5.5.1")
            assert (await conn.command("NOOP")).code == 250

    run(tmp_path, body)


# --------------------------------------------------------------------------- unix socket


def test_unix_socket_mode_0660(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        info = os.stat(tmp_path / "lmtp.sock")
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o660
        result = await deliver(rig.target, "a@example.org", ["ticket@help.example"], mail())
        assert result.codes == (250,)

    run(tmp_path, body, unix=True)


def test_stale_unix_socket_is_replaced(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "lmtp.sock"))
    stale.close()  # the file stays, nobody listens

    async def body(rig: Rig) -> None:
        result = await deliver(rig.target, "a@example.org", ["ticket@help.example"], mail())
        assert result.codes == (250,)

    run(tmp_path, body, unix=True)


def test_unix_path_in_use_or_not_a_socket_is_refused(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        again = UnixListen(tmp_path / "lmtp.sock")
        with pytest.raises(LmtpListenError, match="another process serves it"):
            await start_lmtp(again, rig.handler, hostname=HOSTNAME, max_message_bytes=LIMIT)
        plain = tmp_path / "plain"
        plain.write_text("not a socket")
        with pytest.raises(LmtpListenError, match="not a socket"):
            await start_lmtp(
                UnixListen(plain), rig.handler, hostname=HOSTNAME, max_message_bytes=LIMIT
            )
        assert plain.read_text() == "not a socket"

    run(tmp_path, body, unix=True)


# --------------------------------------------------------------------------- the client


def undo_encoding(wire: bytes) -> bytes:
    assert wire.endswith(b".\r\n")
    body = wire[: -len(b".\r\n")]
    out = [line[1:] if line.startswith(b".") else line for line in body.split(b"\r\n")]
    return b"\r\n".join(out)


def test_encode_data_examples() -> None:
    assert encode_data(b"") == b".\r\n"
    assert encode_data(b"a\nb") == b"a\r\nb\r\n.\r\n"
    assert encode_data(b".\r\n..x\n") == b"..\r\n...x\r\n.\r\n"
    assert encode_data(b"a\r\n.b\r\n") == b"a\r\n..b\r\n.\r\n"


@given(st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b)))
def test_encode_data_round_trip(parts: list[bytes]) -> None:
    data = b"\n".join(parts)
    wire = encode_data(data)
    assert b"\r\n.\r\n" not in wire[:-3]
    assert not wire[:-3].startswith(b".\r\n")
    expected = data.replace(b"\n", b"\r\n")
    if expected and not expected.endswith(b"\r\n"):
        expected += b"\r\n"
    assert undo_encoding(wire) == expected


async def scripted(lines: list[bytes]) -> tuple[asyncio.AbstractServer, tuple[str, int]]:
    """A server that answers every connection with ``lines`` and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for line in lines:
            if line == b"<read>":
                await reader.readline()
            else:
                writer.write(line)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, ("127.0.0.1", server.sockets[0].getsockname()[1])


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ([b"554 5.3.2 go away\r\n"], "lmtp-refused"),
        ([b"hello there\r\n"], "lmtp-protocol"),
        ([b"220-a\r\n", b"221 b\r\n"], "lmtp-protocol"),
        ([b"220 ok\r\n", b"<read>", b"250-host\r\n"], "lmtp-protocol"),
        ([b"220 ok\r\n", b"<read>", b"500 no\r\n"], "lmtp-refused"),
    ],
)
def test_client_refuses_broken_sessions(script: list[bytes], code: str) -> None:
    async def main() -> None:
        server, target = await scripted(script)
        try:
            with pytest.raises(LmtpError) as caught:
                await deliver(target, "a@example.org", ["b@example.org"], b"x\r\n", timeout=5)
            assert caught.value.code == code
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_client_reports_connect_failure() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()

    async def main() -> None:
        with pytest.raises(LmtpError) as caught:
            await deliver(("127.0.0.1", port), "a@example.org", ["b@example.org"], b"x\r\n")
        assert caught.value.code == "lmtp-connect"

    asyncio.run(main())


def test_message_refs_sort_by_time_and_stay_unique() -> None:
    start = 1_795_000_000.0
    refs = [new_message_ref(start + i * 0.001) for i in range(2000)]
    assert refs == sorted(refs)
    same_moment = {new_message_ref(start) for _ in range(10_000)}
    assert len(same_moment) == 10_000
    assert all(len(r) == 4 + 32 and r.startswith("msg-") for r in refs)
    int(refs[0][4:], 16)  # hex


def _iso_ms(now: float) -> str:
    return datetime.fromtimestamp(now, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_received_at_is_what_datetime_writes(now: float) -> None:
    assert received_at(now) == _iso_ms(now)


def test_received_at_at_the_edges_of_a_second_and_a_millisecond() -> None:
    # Rounded half-even to the microsecond first, as datetime does: 0.9999996 s
    # is the next second, 0.0009995 the first millisecond; and a second cached
    # while the next one is asked for.
    start = 1_795_000_000
    for frac in (0.0, 0.0004994, 0.0009995, 0.4999995, 0.9994999, 0.9999994, 0.9999996):
        for now in (start + frac, start + 1 + frac, start + frac):
            assert received_at(now) == _iso_ms(now), now


def test_data_sent_in_small_pieces_is_stored_as_sent(tmp_path: Path) -> None:
    # Dot-stuffed lines, a line that is a lone dot, and the end-of-data line
    # split over many writes: the stored message is the one before stuffing.
    message = mail(body=".hidden\r\n.\r\n..two\r\nlast line.\r\n")

    async def body(rig: Rig) -> None:
        assert isinstance(rig.target, tuple)
        reader, writer = await asyncio.open_connection(*rig.target)
        try:
            await reader.readline()
            writer.write(
                b"LHLO mx\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<ticket@help.example>\r\n"
            )
            writer.write(b"DATA\r\n")
            replies = [await reader.readline() for _ in range(9)]
            assert replies[-1].startswith(b"354"), replies
            wire = encode_data(message) + b"NOOP\r\n"
            for i in range(0, len(wire), 7):
                writer.write(wire[i : i + 7])
                await writer.drain()
                await asyncio.sleep(0.001)
            recorded = await reader.readline()
            assert recorded.startswith(b"250 2.0.0 msg-"), recorded
            assert (await reader.readline()).startswith(b"250")  # the NOOP after the data
        finally:
            writer.close()
            await writer.wait_closed()
        assert await rig.rows("SELECT raw FROM messages") == [(message,)]

    run(tmp_path, body)


@pytest.mark.slow
def test_an_idle_session_is_closed_and_commands_keep_it_open(tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        server = await start_lmtp(
            TcpListen("127.0.0.1", 0),
            rig.handler,
            hostname=HOSTNAME,
            max_message_bytes=LIMIT,
            idle_timeout=1.0,
        )
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert (await reader.readline()).startswith(b"220")
            # Commands for longer than the idle timeout: each one moves it.
            for _ in range(25):
                writer.write(b"NOOP\r\n")
                assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"250")
                await asyncio.sleep(0.1)
            # Then nothing: the server closes the session.
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            await writer.wait_closed()
        finally:
            server.close()
            await server.wait_closed()

    run(tmp_path, body)
