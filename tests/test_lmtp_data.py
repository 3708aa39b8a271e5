"""The LMTP edge's DATA reader reads what aiosmtpd's own reader reads, lines of any length included.

``read_data`` runs on a real ``asyncio.StreamReader`` (with aiosmtpd's
reader limit) fed in pieces split at every kind of place; aiosmtpd's answer
for the same data comes from a real aiosmtpd LMTP server on loopback whose
line limit is lifted, since masd refuses no mail for a long line
(docs/protocol.md §3) where aiosmtpd answers ``500``.  Both must agree on
the message (after dot-unstuffing) or on the refusal (552 too much data),
and the reader must leave what follows the end of the data unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from aiosmtpd.lmtp import LMTP
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masd.edges.lmtp_data import Data, read_data, unstuff
from masd.edges.lmtp_session import LINE_LIMIT

SIZE_LIMIT = 4000
NEXT = b"MAIL FROM:<next@example.org>\r\n"


class _NoLineLimit(LMTP):
    """aiosmtpd's LMTP reading data lines of any length, as masd does."""

    line_length_limit = 1 << 24


class _Keep:
    """aiosmtpd handler: remembers each message's content."""

    def __init__(self) -> None:
        self.contents: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.contents.append(envelope.original_content)
        return "250 kept"


@contextlib.asynccontextmanager
async def aiosmtpd_server() -> AsyncIterator[tuple[asyncio.Server, _Keep]]:
    loop = asyncio.get_running_loop()
    keep = _Keep()
    server = await loop.create_server(
        lambda: _NoLineLimit(keep, data_size_limit=SIZE_LIMIT, hostname="ref", loop=loop),
        "127.0.0.1",
        0,
    )
    try:
        yield server, keep
    finally:
        server.close()
        await server.wait_closed()


async def aiosmtpd_answer(server: asyncio.Server, keep: _Keep, data: bytes) -> Data:
    """What aiosmtpd makes of ``data`` (everything after 354, end line included)."""
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def reply() -> bytes:
        while True:
            line = await reader.readline()
            if line[3:4] != b"-":
                return line

    try:
        await reply()
        writer.write(
            b"LHLO ref\r\nMAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.org>\r\nDATA\r\n"
        )
        for _ in range(4):
            last = await reply()
        assert last.startswith(b"354"), last
        writer.write(data)
        answer = await reply()
    finally:
        writer.close()
        await writer.wait_closed()
    if answer.startswith(b"250"):
        return Data(content=keep.contents.pop())
    assert answer.startswith(b"552"), answer
    return Data(too_much=True)


async def masd_answer(pieces: Sequence[bytes]) -> tuple[Data, bytes]:
    """What read_data makes of the pieces, and what it left in the reader."""
    reader = asyncio.StreamReader(limit=LINE_LIMIT)  # aiosmtpd's reader limit

    async def feed() -> None:
        for piece in pieces:
            reader.feed_data(piece)
            await asyncio.sleep(0)
        reader.feed_eof()

    feeder = asyncio.ensure_future(feed())
    data = await read_data(reader, SIZE_LIMIT)
    await feeder
    return data, await reader.read()


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


# Each body as a client sends it: dot-stuffed, ending with CR LF.
BODIES = {
    "empty": b"",
    "one line": b"Hello\r\n",
    "one dot-stuffed line": b"..\r\n",
    "dots": b"From: a@example.org\r\n\r\n..leading\r\n..\r\n...\r\nend.\r\n.x\r\n",
    "a line that is a dot, stuffed": b"a\r\n..\r\nb\r\n",
    "bare LF and CR": b"a\nb\rc\r\n\n.\n\r.\r\r\n",
    "line of 999": b"x" * 999 + b"\r\n",
    "line of 1000": b"x" * 1000 + b"\r\n",
    "line of 1001": b"x" * 1001 + b"\r\n",
    "line of 1002": b"x" * 1002 + b"\r\n",
    "line of 1523 (a real Outlook reply's)": b"<p>" + b"w" * 1516 + b"</p>\r\n",
    "line of 3800, under the size limit": b"v" * 3800 + b"\r\n",
    "line of 3999, over the size limit": b"u" * 3999 + b"\r\n",
    "line of 3000": b"y\r\n" + b"z" * 3000 + b"\r\nafter\r\n",
    "at the limit": (b"a" * 78 + b"\r\n") * 50,
    "one over the limit": (b"a" * 78 + b"\r\n") * 50 + b"\r\n",
    "far over the limit": (b"b" * 70 + b"\r\n") * 400,
    "long line after the limit": (b"c" * 70 + b"\r\n") * 100 + b"d" * 2000 + b"\r\n",
    "long line before the limit": b"d" * 2000 + b"\r\n" + (b"c" * 70 + b"\r\n") * 100,
    "CR before the end": b"text\r\r\n",
    "end-like text": b"a\r\n.\r \r\n\r\n. \r\n",
}


def test_the_bodies_agree_in_one_piece_and_split_everywhere() -> None:
    async def main() -> None:
        async with aiosmtpd_server() as (server, keep):
            for name, body in BODIES.items():
                data = body + b".\r\n"
                expected = await aiosmtpd_answer(server, keep, data)
                cuts = [(0,), (1,), (2,), (len(data) - 1,), (len(data) - 2,), (len(data) - 4,)]
                cuts += [(i, i + 1, i + 3) for i in range(0, len(data), max(1, len(data) // 40))]
                for c in cuts:
                    got, left = await masd_answer(split(data + NEXT, c))
                    assert got == expected, (name, c)
                    assert left == NEXT, (name, c)

    asyncio.run(main())


def test_a_long_line_is_kept_byte_for_byte() -> None:
    async def main() -> None:
        line = bytes(range(33, 127)) * 40  # 3760 octets
        data, left = await masd_answer([b"a\r\n", line[:7], line[7:] + b"\r\n..b\r\n.\r\n", NEXT])
        assert data == Data(content=b"a\r\n" + line + b"\r\n.b\r\n")
        assert left == NEXT

    asyncio.run(main())


def test_an_empty_message_is_empty_and_a_refusal_keeps_nothing() -> None:
    async def main() -> None:
        assert await masd_answer([b".\r\n"]) == (Data(content=b""), b"")
        data, _ = await masd_answer([(b"q" * 80 + b"\r\n") * 100, b".\r\n"])
        assert data == Data(too_much=True)
        assert data.content == b""

    asyncio.run(main())


def test_the_connection_closing_inside_the_data_is_an_incomplete_read() -> None:
    async def main() -> None:
        with pytest.raises(asyncio.IncompleteReadError):
            await masd_answer([b"Subject: x\r\n\r\nhalf a message\r\n"])

    asyncio.run(main())


_PIECES = st.sampled_from(
    [
        b"a",
        b"Z",
        b".",
        b"..",
        b"\r",
        b"\n",
        b"\r\n",
        b"\r\n.",
        b".\r\n",
        b"\r\n.\r",
        b" ",
        b"x" * 500,
        b"y" * 999,
        b"l" * 2500,
        b"\xff",
        b"Subject: hi\r\n",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_PIECES, max_size=20).map(b"".join),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
)
def test_any_body_agrees_with_aiosmtpd(body: bytes, cuts: list[int]) -> None:
    # The body as a client sends it: ending with CR LF, every line that
    # begins with a dot given one more (RFC 5321 §4.5.2).
    if body and not body.endswith(b"\r\n"):
        body += b"\r\n"
    body = (b"\r\n" + body).replace(b"\r\n.", b"\r\n..")[2:]
    data = body + b".\r\n"

    async def main() -> None:
        async with aiosmtpd_server() as (server, keep):
            expected = await aiosmtpd_answer(server, keep, data)
        got, left = await masd_answer(split(data + NEXT, cuts))
        assert got == expected
        assert left == NEXT

    asyncio.run(main())


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_PIECES | st.sampled_from([b".\r\n.", b"\r\r\n..", b"\n."]), max_size=30).map(
        b"".join
    ),
    st.integers(min_value=1, max_value=40),
)
def test_unstuffing_window_by_window_is_one_replace_over_the_whole(
    data: bytes, window: int
) -> None:
    # What read_data hands unstuff: a CR LF, the data, the end-of-data line.
    body = bytearray(b"\r\n" + data + b"\r\n.\r\n")
    expected = bytes(body[:-3]).replace(b"\r\n.", b"\r\n")[2:]
    assert unstuff(body, window) == expected


class _CountingReader(asyncio.StreamReader):
    """A stream reader that counts the reads made of it."""

    reads = 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        return await super().read(n)

    async def readexactly(self, n: int) -> bytes:
        self.reads += 1
        return await super().readexactly(n)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        self.reads += 1
        return await super().readuntil(separator)


@pytest.mark.parametrize(
    "body",
    [b"\r\n" * 131_072, b"Subject: x\r\n" + b"\r\n" * 131_072, b"..\r\n" * 65_536],
    ids=["blank lines", "blank lines after a header", "dot lines"],
)
def test_data_is_read_in_a_few_reads_whatever_its_lines(body: bytes) -> None:
    # Reading exactly up to each possible end took one read per blank line
    # (65,536 for 256 KiB) and held the event loop for seconds.
    async def main() -> None:
        reader = _CountingReader(limit=LINE_LIMIT)
        reader.feed_data(body + b".\r\n" + NEXT)
        data = await read_data(reader, None)
        assert data.content == body.replace(b"\r\n..", b"\r\n.").removeprefix(b".")
        assert await reader.readexactly(len(NEXT)) == NEXT
        assert reader.reads == 2, reader.reads  # the data, then what followed it

    asyncio.run(main())
