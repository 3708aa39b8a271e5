"""The policy listener: Postfix's access policy delegation on real sockets.

A real Store in tmp_path, a Runtime from a real config file, the listener on
loopback TCP or a unix socket; requests are written the way Postfix's smtpd
writes them (``name=value`` lines, an empty line).  Cases are created
through the LMTP edge's own recording, so the policy answers are checked
against what masd really stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import stat
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.bounces import bounce_address_of
from support.http import open_case_through
from support.masd_process import free_port
from support.ticket import write_ticket_config

from masd.app import App
from masd.clock import Clock
from masd.config import Config, TcpListen, UnixListen
from masd.edges.context import EdgeContext
from masd.edges.lmtp import LmtpHandler, Replies
from masd.edges.policy import (
    MAX_ATTRIBUTES,
    MAX_LINE,
    METRIC,
    PolicyHandler,
    PolicyListenError,
    PolicyRequestError,
    PolicyServer,
    action_for,
    parse_request,
    start_policy,
)
from masd.metrics import Metrics
from masd.service import Runtime
from masd.store import Store

WAIT = 10.0


def write_config(directory: Path, listeners: str = "") -> Config:
    return write_ticket_config(directory, server=listeners)


def request(recipient: str | None, **attrs: str) -> dict[str, str]:
    """A request as Postfix 3.7's smtpd sends it at RCPT (the usual attributes)."""
    base = {
        "request": "smtpd_access_policy",
        "protocol_state": "RCPT",
        "protocol_name": "ESMTP",
        "client_address": "192.0.2.7",
        "client_name": "mail.example.org",
        "reverse_client_name": "mail.example.org",
        "helo_name": "mail.example.org",
        "sender": "ann@example.org",
        "queue_id": "",
        "instance": "1b2c.6744a1b2.9c0d2.0",
        "size": "0",
        "etrn_domain": "",
        "stress": "",
        "sasl_method": "",
        "ccert_subject": "",
        "encryption_protocol": "TLSv1.3",
        "policy_context": "",
        "server_address": "127.0.0.1",
        "server_port": "25",
        "compatibility_level": "3.6",
        "mail_version": "3.7.11",
    }
    if recipient is not None:
        base["recipient"] = recipient
        base["recipient_count"] = "0"
    base.update(attrs)
    return base


def encode(attrs: Mapping[str, str]) -> bytes:
    return b"".join(f"{k}={v}\n".encode() for k, v in attrs.items()) + b"\n"


class Client:
    """One connection to the listener, like one smtpd process's."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> str:
        """The next answer: ``action=...`` then an empty line; returns the action."""
        async with asyncio.timeout(WAIT):
            first = await self.reader.readline()
            second = await self.reader.readline()
        assert second == b"\n", (first, second)
        assert first.startswith(b"action="), first
        assert first.endswith(b"\n"), first
        return first[len(b"action=") : -1].decode("ascii")

    async def ask(self, attrs: Mapping[str, str]) -> str:
        await self.send(encode(attrs))
        return await self.reply()

    async def at_eof(self) -> bool:
        """Whether the listener ended the connection (EOF, or a reset when it
        closed with unread input), reading what it sent before."""
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
    server: PolicyServer
    lmtp: LmtpHandler

    @property
    def target(self) -> tuple[str, int] | str:
        (address,) = self.server.addresses
        if isinstance(address, tuple):
            return str(address[0]), int(address[1])
        return str(address)

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        target = self.target
        if isinstance(target, str):
            reader, writer = await asyncio.open_unix_connection(target)
        else:
            reader, writer = await asyncio.open_connection(*target)
        client = Client(reader, writer)
        try:
            yield client
        finally:
            await client.close()

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
    handler = PolicyHandler(EdgeContext(rt, store, Clock(), metrics))
    lmtp = LmtpHandler(EdgeContext(rt, store, Clock(), metrics))
    server = await start_policy(listen or TcpListen("127.0.0.1", 0), handler, max_connections=cap)
    try:
        yield Rig(config, store, metrics, server, lmtp)
    finally:
        await server.close()
        await asyncio.to_thread(store.close)


# --------------------------------------------------------------------------- pure parts


def test_parse_request_reads_name_value_lines() -> None:
    attrs = parse_request([b"request=smtpd_access_policy", b"recipient=a=b@x", b"sender="])
    assert attrs == {"request": "smtpd_access_policy", "recipient": "a=b@x", "sender": ""}


@pytest.mark.parametrize(
    ("lines", "detail"),
    [
        ([b"no equals sign"], "is not name=value"),
        ([b"=value"], "is not name=value"),
        ([b" recipient=x@y"], "is not name=value"),
        ([b"sender=a", b"sender=b"], "'sender' given twice"),
        ([b"a=1"] * (MAX_ATTRIBUTES + 1), f"over {MAX_ATTRIBUTES}"),
    ],
)
def test_parse_request_refuses_what_is_not_a_request(lines: list[bytes], detail: str) -> None:
    with pytest.raises(PolicyRequestError) as caught:
        parse_request(lines)
    assert caught.value.code == "policy-request"
    assert detail in caught.value.detail


def test_action_for_maps_lmtp_replies_to_access_actions() -> None:
    assert action_for(Replies.RECIPIENT_OK, "x ok").action == "DUNNO"
    assert action_for(Replies.UNKNOWN_DOMAIN, "not ours").action == "DUNNO"
    assert action_for(Replies.UNKNOWN_CASE, "id: no case").action == "REJECT 5.1.1 id: no case"
    assert action_for(Replies.UNKNOWN_TYPE, "type: x").action == "REJECT 5.1.1 type: x"
    assert action_for(Replies.BAD_ADDRESS, "local: y").action == "REJECT 5.1.1 local: y"
    assert action_for(Replies.FAULT, "store down").action == "DEFER_IF_PERMIT 4.3.0 store down"
    # A detail never breaks the one-line answer.
    odd = action_for(Replies.UNKNOWN_CASE, "a\nb\r\x00c" + "é" * 1000).action
    assert odd.isascii()
    assert odd.isprintable()
    assert len(odd) < 500


# --------------------------------------------------------------------------- the listener


def test_connections_over_the_cap_are_deferred_and_closed(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, cap=2) as r, r.client() as one, r.client() as two:
            for client in (one, two):
                assert await client.ask(request("ticket@help.example")) == "DUNNO"
            async with r.client() as third:
                assert await third.reply() == (
                    "DEFER_IF_PERMIT 4.3.2 2 policy connections open "
                    "(server.max_policy_connections), try again later"
                )
                assert await third.at_eof()
            refused = r.metrics.value("masd_connections_refused_total", listener="policy")
            assert refused == 1
            await one.close()
            await asyncio.sleep(0.05)
            async with r.client() as again:  # under the cap again
                assert await again.ask(request("ticket@help.example")) == "DUNNO"

    asyncio.run(main())


def test_answers_every_kind_of_recipient_on_one_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            case = await r.open_case()
            assert case == "ticket=ticket-1@help.example"
            async with r.client() as c:
                assert await c.ask(request("ticket@help.example")) == "DUNNO"
                assert await c.ask(request("ticket!callback@help.example")) == "DUNNO"
                assert await c.ask(request("TICKET=TICKET-1@Help.Example")) == "DUNNO"
                assert await c.ask(request("ticket=ticket-1+tag@help.example")) == "DUNNO"
                assert await c.ask(request("ticket=ticket-2@help.example")) == (
                    "REJECT 5.1.1 id: no case ticket=ticket-2@help.example"
                )
                unknown_type = await c.ask(request("billing@help.example"))
                assert unknown_type.startswith("REJECT 5.1.1 type: no type 'billing'")
                bad_local = await c.ask(request("ticket=a..b@help.example"))
                assert bad_local.startswith("REJECT 5.1.1 ")
                # Not masd's domain: Postfix's own restrictions decide.
                assert await c.ask(request("ann@example.org")) == "DUNNO"
                # Not at RCPT (e.g. listed under smtpd_data_restrictions): no opinion.
                data_stage = request("ticket=ticket-9@help.example", protocol_state="DATA")
                assert await c.ask(data_stage) == "DUNNO"
            assert r.metrics.value(METRIC, outcome="reject") == 3
            assert r.metrics.value(METRIC, outcome="dunno") == 5
            assert r.metrics.value(METRIC, outcome="not-rcpt") == 1

    asyncio.run(main())


def test_utf8_recipients(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r, r.client() as c:
            # SMTPUTF8: a UTF-8 local part is judged like any other (no such type).
            answer = await c.ask(request("tïcket@help.example"))
            assert answer.startswith("REJECT 5.1.1 ")
            # Bytes that are not UTF-8 are refused by name, not crashed on.
            await c.send(encode(request(None))[:-1] + b"recipient=t\xffx@help.example\n\n")
            answer = await c.reply()
            assert answer.startswith("REJECT 5.1.1 address: ")
            assert "is not UTF-8" in answer

    asyncio.run(main())


def test_store_unavailable_defers(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            await r.open_case()
            await asyncio.to_thread(r.store.close)
            async with r.client() as c:
                answer = await c.ask(request("ticket=ticket-1@help.example"))
                assert answer == "DEFER_IF_PERMIT 4.3.0 store unavailable, try again later"
                # An intake address needs no store: still accepted.
                assert await c.ask(request("ticket@help.example")) == "DUNNO"
            assert r.metrics.value(METRIC, outcome="defer") == 1

    asyncio.run(main())


def test_malformed_requests_get_dunno_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r, r.client() as c:
            assert await c.ask({"request": "something_else", "recipient": "x@help.example"}) == (
                "DUNNO"
            )
            assert await c.ask(request("")) == "DUNNO"  # RCPT without a recipient
            await c.send(b"this is not an attribute\n\n")
            assert await c.reply() == "DUNNO"
            await c.send(b"sender=a\nsender=b\n\n")
            assert await c.reply() == "DUNNO"
            # CRLF line ends and stray empty lines between requests are accepted.
            await c.send(
                b"\n\n" + encode(request("ticket=ticket-5@help.example")).replace(b"\n", b"\r\n")
            )
            assert (await c.reply()).startswith("REJECT 5.1.1 id: no case")
            # Two requests in one write (pipelined): two answers, in order.
            await c.send(encode(request("ticket@help.example")) + encode(request("x@help.example")))
            assert await c.reply() == "DUNNO"
            assert (await c.reply()).startswith("REJECT 5.1.1 ")
            assert r.metrics.value(METRIC, outcome="malformed") == 4

    asyncio.run(main())


def test_over_long_line_gets_dunno_and_the_connection_is_closed(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            async with r.client() as c:
                await c.send(b"recipient=" + b"a" * (MAX_LINE + 10) + b"\n\n")
                assert await c.reply() == "DUNNO"
                assert await c.at_eof()
            async with r.client() as c:
                await c.send(b"".join(b"a%d=1\n" % i for i in range(MAX_ATTRIBUTES + 1)))
                assert await c.reply() == "DUNNO"
                assert await c.at_eof()
            # A client that hangs up halfway through a request harms nobody.
            async with r.client() as c:
                await c.send(b"request=smtpd_access_policy\nprotocol_st")
            async with r.client() as c:
                assert await c.ask(request("ticket@help.example")) == "DUNNO"
            assert r.metrics.value(METRIC, outcome="malformed") == 2

    asyncio.run(main())


EXPECTED = "REJECT 5.1.1 type: no type 'nosuch' at help.example"


@settings(max_examples=15, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8))
def test_arbitrary_bytes_never_break_the_listener(
    tmp_path_factory: pytest.TempPathFactory, garbage: list[bytes]
) -> None:
    async def main() -> None:
        async with rig(tmp_path_factory.mktemp("p")) as r:
            for data in garbage:
                async with r.client() as c:
                    # Garbage, an end of request, then a real request: every answer
                    # is a well-formed action, and the real one is answered (unless
                    # the garbage had a line so long that the listener hung up).
                    await c.send(data + b"\n\n" + encode(request("nosuch@help.example")))
                    answers: list[str] = []
                    while not answers or answers[-1] != EXPECTED:
                        async with asyncio.timeout(WAIT):
                            line = await c.reader.readline()
                        if not line:
                            assert len(data) > MAX_LINE
                            break
                        assert line.startswith(b"action="), line
                        assert line.endswith(b"\n"), line
                        assert await c.reader.readline() == b"\n"
                        answers.append(line[7:-1].decode("ascii"))
                    assert all(a == "DUNNO" or a.startswith("REJECT 5.1.1 ") for a in answers)
            async with r.client() as c:
                assert await c.ask(request("nosuch@help.example")) == EXPECTED

    asyncio.run(main())


def test_unix_socket_listener(tmp_path: Path) -> None:
    async def main() -> None:
        path = tmp_path / "policy.sock"
        # A stale socket left by a process that is gone is replaced.
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))
        stale.close()
        async with rig(tmp_path, UnixListen(path)) as r:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
            async with r.client() as c:
                assert await c.ask(request("ticket@help.example")) == "DUNNO"
            # Another listener on the same path while this one serves: refused by name.
            handler = PolicyHandler(EdgeContext(Runtime(r.config, lambda: "x"), r.store))
            with pytest.raises(PolicyListenError) as caught:
                await start_policy(UnixListen(path), handler)
            assert "another process serves it" in caught.value.detail

    asyncio.run(main())


def test_listen_errors_are_named(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            handler = PolicyHandler(EdgeContext(Runtime(r.config, lambda: "x"), r.store))
            target = r.target
            assert isinstance(target, tuple)
            host, port = target
            with pytest.raises(PolicyListenError) as caught:
                await start_policy(TcpListen(host, port), handler)
            assert caught.value.code == "policy-listen"
            assert f"cannot listen on 127.0.0.1:{port}" in caught.value.detail
            not_a_socket = tmp_path / "plain-file"
            not_a_socket.write_text("")
            with pytest.raises(PolicyListenError) as caught:
                await start_policy(UnixListen(not_a_socket), handler)
            assert "is not a socket" in caught.value.detail
            with pytest.raises(PolicyListenError):
                await start_policy(None, handler)

    asyncio.run(main())


def test_close_ends_open_connections(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            target = r.target
            assert isinstance(target, tuple)
            async with r.client() as idle, r.client() as mid_request:
                assert await idle.ask(request("ticket@help.example")) == "DUNNO"
                await mid_request.send(b"request=smtpd_access_policy\n")
                await r.server.close()
                assert await idle.at_eof()
                assert await mid_request.at_eof()
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(*target)

    asyncio.run(main())


def test_app_runs_the_policy_listener_when_configured(tmp_path: Path) -> None:
    async def main() -> None:
        lmtp, http, policy = free_port(), free_port(), free_port()
        config = write_config(
            tmp_path,
            f'lmtp = "127.0.0.1:{lmtp}"\nhttp = "127.0.0.1:{http}"\npolicy = "127.0.0.1:{policy}"',
        )
        app = App(config, sockets={})
        listening = await app.start()
        try:
            assert listening.policy is not None
            assert listening.policy.addresses == [("127.0.0.1", policy)]
            reader, writer = await asyncio.open_connection("127.0.0.1", policy)
            client = Client(reader, writer)
            assert await client.ask(request("ticket=ticket-1@help.example")) == (
                "REJECT 5.1.1 id: no case ticket=ticket-1@help.example"
            )
            await app.stop()
            # Stopping closed the open connection and the listener.
            assert await client.at_eof()
            await client.close()
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", policy)
        finally:
            await app.stop()

        # Without server.policy there is no policy listener.
        other = tmp_path / "other"
        other.mkdir()
        app = App(
            write_config(other, f'lmtp = "127.0.0.1:{lmtp}"\nhttp = "127.0.0.1:{http}"'),
            sockets={},
        )
        listening = await app.start()
        try:
            assert listening.policy is None
        finally:
            await app.stop()

    asyncio.run(main())


def test_bounce_addresses_are_checked_by_their_tag(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r, r.client() as client:
            case = await r.open_case()
            ack = await bounce_address_of(r.store, case)
            local, _, domain = case.partition("@")
            assert ack.startswith(f"{local}+bounce-")
            assert await client.ask(request(ack)) == "DUNNO"
            assert await client.ask(request(ack.upper())) == "DUNNO"
            for forged in (
                f"{local}+bounce-1-aaaaaaaaaaaaaaaa@{domain}",
                f"{local}+bounce-@{domain}",
            ):
                answer = await client.ask(request(forged))
                assert answer == f"REJECT 5.1.1 bounce address of {case}: tag does not verify"

    asyncio.run(main())
