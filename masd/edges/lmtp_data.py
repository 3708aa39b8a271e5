"""The mail data after DATA: read in large pieces up to the end-of-data line, then unstuffed.

:func:`read_data` is what :class:`masd.edges.lmtp_session.LmtpProtocol` reads the data
with instead of aiosmtpd's one line per ``await``: time linear in the data's length
whatever its lines, lines of any length, aiosmtpd's size limit counted as aiosmtpd counts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

#: RFC 5321 §4.1.1.4: the mail data ends with a line holding one dot.
_END: Final = b"\r\n.\r\n"


#: Most octets one read of the data takes: more than a stream reader ever holds (a
#: transport hands it at most 256 KiB at a time and pauses past twice its limit).
READ_PIECE: Final = 1 << 24
#: How much of the message :func:`unstuff` copies at a time.
UNSTUFF_WINDOW: Final = 1 << 20


@dataclass(frozen=True)
class Data:
    """What :func:`read_data` read: the message, or that it was over the size limit."""

    content: bytes = b""
    too_much: bool = False  # over the size limit (answered 552)
    #: The data's octets as the size limit counts them (aiosmtpd's count:
    #: dots still stuffed, the end-of-data line off); aiosmtpd does not say it.
    size: int = field(default=0, compare=False)


def unstuff(body: bytearray, window: int = UNSTUFF_WINDOW) -> bytes:
    """The message in ``body``: a CR LF, the data, then the end-of-data line's ``.\\r\\n``.

    The leading dot of each line goes (RFC 5321 §4.5.2) and so do the CR LF
    before the data and the end line.  The octets are moved down inside
    ``body`` itself, ``window`` of them at a time, so besides ``body`` only
    the message returned is held at once, never a third copy of it.
    ``body`` is spent.
    """
    window = max(window, 3)  # room to step back off a cut and still move on
    end = len(body) - 3  # the final ".\r\n" off; the last line's CR LF stays
    read = write = 0
    while read < end:
        stop = min(read + window, end)
        if stop < end:
            # No cut inside a CR LF ".": the sequences never overlap, so
            # replacing window by window removes exactly the dots that one
            # replace over the whole would.
            if body[stop - 1] == 0x0D:
                stop -= 1
            elif body[stop - 2 : stop] == b"\r\n":
                stop -= 2
        piece = body[read:stop].replace(b"\r\n.", b"\r\n")
        body[write : write + len(piece)] = piece
        write += len(piece)
        read = stop
    with memoryview(body) as view:
        return bytes(view[2:write])


async def read_data(reader: asyncio.StreamReader, size_limit: int | None) -> Data:
    """Read mail data up to the end-of-data line, in pieces as large as the reader holds.

    The data is searched as if a CR LF came before it (the DATA command's own
    line end), so data that is only "." is an empty message.  Each read takes
    all the reader holds (:data:`READ_PIECE`), and the end-of-data sequence is
    looked for in what was read, from where the last search stopped: a
    sequence split between two reads is found, and any data costs one search
    over its length, blank lines included (reading exactly up to each possible
    end, as a stream reader's ``readuntil`` would need, took one read per
    blank line).  What was read past the end-of-data line (a pipelining
    client's next command) is put back in front of the reader's buffer
    (:func:`_give_back`).  More than ``size_limit`` octets is ``too_much``,
    counted as aiosmtpd counts, and refused data is still read to its end but
    not kept.  Lines may be of any length.  A leading dot is removed from each
    line (:func:`unstuff`).
    """
    body = bytearray(b"\r\n")
    dropped = 0  # octets let go from the front of body (data over the size limit)
    searched = 0  # no end-of-data sequence starts in body before this offset
    while True:
        piece = await reader.read(READ_PIECE)
        if not piece:
            raise asyncio.IncompleteReadError(bytes(body), None)
        body += piece
        end = body.find(_END, searched)
        if end >= 0:
            break
        searched = max(0, len(body) - (len(_END) - 1))
        if size_limit and dropped + searched > size_limit + len(_END):
            # Over the limit: keep only what finding the end-of-data sequence needs.
            del body[:searched]
            dropped += searched
            searched = 0
    _give_back(reader, body[end + len(_END) :])
    size = dropped + end  # aiosmtpd's count: dots still stuffed, the end line off
    if dropped or (size_limit and size > size_limit):
        return Data(too_much=True, size=size)
    del body[end + len(_END) :]
    return Data(content=unstuff(body), size=size)


def _give_back(reader: asyncio.StreamReader, excess: bytearray) -> None:
    """Put ``excess`` back in front of what ``reader`` holds, to be read next.

    ``feed_data`` would put it behind, and is refused once the peer closed;
    the reader's buffer (a private name, checked at start by
    :func:`missing_private_names`) takes it in front in both cases."""
    if excess:
        held: bytearray = reader._buffer  # type: ignore[attr-defined]
        held[0:0] = excess
