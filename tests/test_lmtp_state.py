"""The LMTP session's states and moves (masd/edges/lmtp_state.py), as a table and on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Sequence

import pytest

from masd.edges import lmtp_session
from masd.edges.lmtp_replies import RecipientReplies, Replies, ReplyCode
from masd.edges.lmtp_session import LmtpProtocol
from masd.edges.lmtp_state import (
    IN_DATA,
    TRANSITIONS,
    Event,
    SessionStateError,
    State,
    next_state,
)

WAIT = 10.0


def test_every_state_is_reached_and_every_event_used() -> None:
    reached = {State.GREETING} | set(TRANSITIONS.values())
    assert reached == set(State)
    assert {event for _, event in TRANSITIONS} == set(Event)
    # Every state but the greeting can go on: none is a dead end.
    assert {state for state, _ in TRANSITIONS} == set(State)


def test_the_data_states_always_lead_back_to_commands() -> None:
    for state in IN_DATA:
        assert next_state(state, Event.ANSWERED) is State.COMMANDS
        assert next_state(state, Event.DATA_ENDED) is State.COMMANDS


def test_a_move_not_in_the_table_is_refused_by_role_state_and_event() -> None:
    missing = [p for p in itertools.product(State, Event) if p not in TRANSITIONS]
    assert len(missing) == len(State) * len(Event) - len(TRANSITIONS)
    for state, event in missing:
        with pytest.raises(SessionStateError) as info:
            next_state(state, event)
        assert (info.value.state, info.value.event) == (state, event)
        text = str(info.value)
        assert "LMTP server" in text
        assert repr(state.value) in text
        assert repr(event.value) in text


class _Handler:
    """What LmtpProtocol needs of its handler: keeps each message, answers 250 each."""

    size_limit = 2000

    def __init__(self) -> None:
        self.states: list[State] = []
        self.session: LmtpProtocol | None = None

    def per_recipient(self, reply: ReplyCode, text: str, rcpts: Sequence[str]) -> RecipientReplies:
        return RecipientReplies("\r\n".join(reply.line(text) for _ in rcpts))

    async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
        assert self.session is not None
        self.states.append(self.session.state)
        return self.per_recipient(Replies.RECORDED, "kept", ["a", "b"])


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[int, _Handler]]:
    loop = asyncio.get_running_loop()
    handler = _Handler()

    def factory() -> LmtpProtocol:
        handler.session = LmtpProtocol(
            handler, data_size_limit=handler.size_limit, hostname="state", loop=loop
        )
        return handler.session

    server = await loop.create_server(factory, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], handler
    finally:
        server.close()
        await server.wait_closed()


async def _replies(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        line = await asyncio.wait_for(reader.readline(), WAIT)
        if line[3:4] != b"-":
            out.append(line)
    return out


def test_a_session_moves_through_the_states_and_answers_by_state() -> None:
    async def main() -> None:
        async with _server() as (port, handler):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                (greeting,) = await _replies(reader, 1)
                assert greeting.startswith(b"220 state ")
                assert handler.session is not None
                assert handler.session.state is State.COMMANDS
                writer.write(b"LHLO c\r\nMAIL FROM:<a@example.org>\r\n")
                writer.write(b"RCPT TO:<a@example.org>\r\nRCPT TO:<b@example.org>\r\nDATA\r\n")
                lhlo, mail, *_rcpts, go = await _replies(reader, 5)
                assert lhlo.startswith(b"250 ")
                assert not lhlo.startswith(b"250 2.")
                assert mail.startswith(b"250 2.")
                assert go.startswith(b"354 End data")
                writer.write(b"Subject: x\r\n\r\nhi\r\n.\r\n")
                assert await _replies(reader, 2) == [b"250 2.0.0 kept\r\n"] * 2
                assert handler.states == [State.RECORDING]
                assert handler.session.state is State.COMMANDS
                # Refused by the size limit: one line per recipient, back to commands.
                writer.write(b"MAIL FROM:<a@example.org>\r\nRCPT TO:<a@example.org>\r\n")
                writer.write(b"DATA\r\n" + (b"q" * 70 + b"\r\n") * 40 + b".\r\nNOOP\r\n")
                *_, too_big, noop = await _replies(reader, 5)
                assert too_big.startswith(b"552 5.3.4 message over 2000 octets")
                assert noop.startswith(b"250 2.0.0")
                assert handler.states == [State.RECORDING]
            finally:
                writer.close()
                await writer.wait_closed()

    asyncio.run(main())


def test_a_client_that_does_not_read_its_replies_is_waited_for_and_loses_none() -> None:
    """Replies are written without waiting on the writer until its buffer passes the
    high-water mark; then the session waits, so what it holds stays bounded (replies held to
    go out together stop at HOLD_BYTES)."""
    commands = 200_000  # some 3 MB of replies, far more than the sockets hold

    async def main() -> None:
        async with _server() as (port, handler):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
            try:
                await _replies(reader, 1)
                assert handler.session is not None
                served = handler.session._writer.transport
                served.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
                )
                writer.write(b"NOOP\r\n" * commands)  # nothing read meanwhile
                held = 0
                for _ in range(20):
                    await asyncio.sleep(0.05)
                    held = max(held, served.get_write_buffer_size())
                high = served.get_write_buffer_limits()[1]
                # Past the mark by at most one write: the replies held to go out together
                # (HOLD_BYTES) and the one that ends them.
                assert 0 < held <= high + lmtp_session.HOLD_BYTES + 100, (held, high)
                replies = await _replies(reader, commands)
                assert set(replies) == {b"250 2.0.0 OK\r\n"}
            finally:
                writer.close()
                await writer.wait_closed()

    asyncio.run(main())
