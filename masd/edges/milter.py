"""The milter listener: Postfix (``smtpd_milters``) or Sendmail asks masd during SMTP.

docs/protocol.md §17: the same recipient answers as the LMTP edge and the policy
listener, from the one check (:func:`masd.edges.lmtp.check_recipient`):

- accepted, or a domain masd does not serve: continue (the MTA decides);
- a permanent refusal: ``550 5.1.1 <detail>`` (``5.1.2`` for a domain) at RCPT;
- the store cannot be read: ``451 4.3.0`` at RCPT, never a permanent refusal;
- a message over ``server.max_message_bytes``: ``552 5.3.4`` at end of data.

masd never changes a message: it negotiates no modification actions.  The
protocol (framing, negotiation, which reply each event allows) is
``kilter.protocol``'s sans-I/O state machine; this module does the I/O.  A
connection that breaks the protocol is logged and closed, and the MTA
applies its own default (Postfix: ``milter_default_action``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Final

from kilter.protocol import (
    Abort,
    ActionFlags,
    Body,
    Close,
    Continue,
    EndOfMessage,
    EnvelopeFrom,
    EnvelopeRecipient,
    FilterProtocol,
    Header,
    InvalidMessage,
    Macro,
    Negotiate,
    ProtocolFlags,
    ReplyCode,
    ResponseMessage,
    UnexpectedMessage,
    UnknownMessage,
)
from kilter.protocol.buffer import SimpleBuffer
from kilter.protocol.core import FilterMessage, MTAMessage

from masd.config import Listen
from masd.core.errors import MasdError
from masd.edges.context import EdgeContext
from masd.edges.limits import Gate
from masd.edges.lmtp import Replies, check_recipient
from masd.edges.lmtp import ReplyCode as LmtpReply
from masd.edges.sockets import ListenError, StreamListener, serve
from masd.metrics import Metrics
from masd.service import Runtime
from masd.store import StoreHandle

log = logging.getLogger("masd.milter")

#: The protocol version masd speaks (Sendmail 8.14+, Postfix 2.6+).
VERSION: Final = 6
#: Room for the largest message the MTA sends: body chunks are at most 64 KiB
#: (masd asks for no larger ones), headers at most Postfix's header_size_limit.
BUFFER_BYTES: Final = 256 * 1024
#: Idle time allowed between events (Postfix's milter_content_timeout is 300 s).
IDLE_TIMEOUT: Final = 600.0
CLOSE_TIMEOUT: Final = 5.0
METRIC: Final = "masd_milter_replies_total"
#: ``server.max_milter_connections`` by default.
MAX_CONNECTIONS: Final = 100
#: The oldest protocol version masd answers (version 2 is Sendmail 8.13's).
MIN_VERSION: Final = 2
#: A negotiate frame's data: version, actions and protocol flags (4 octets each).
_NEGOTIATE_DATA: Final = 12
#: Events masd does not need; asked to be left out when the MTA offers it.
_NOT_NEEDED: Final = (
    ProtocolFlags.NO_CONNECT
    | ProtocolFlags.NO_HELO
    | ProtocolFlags.NO_UNKNOWN
    | ProtocolFlags.NO_DATA
    | ProtocolFlags.NO_END_OF_HEADERS
    | ProtocolFlags.NR_HEADER
    | ProtocolFlags.NR_BODY
)


class MilterListenError(ListenError):
    """The milter listener cannot start (address in use, a non-socket at the path)."""

    code = "milter-listen"


class MilterFrameError(MasdError):
    """A frame masd will not answer: malformed, or out of order (the connection is closed)."""

    code = "milter-frame"


def check_opening(frame: bytes | memoryview) -> None:
    """Refuse, by name, a connection's first frame that is not a usable negotiation.

    ``frame`` holds at least the frame's length and command; all of it when
    the command is a negotiation.  The MTA must negotiate before anything else,
    with all three 4-octet fields and a version masd speaks.
    """
    length = int.from_bytes(frame[:4], "big")
    if length == 0:
        raise MilterFrameError("an empty frame (no command) before negotiation")
    command = bytes(frame[4:5])
    if command != b"O":
        raise MilterFrameError(f"command {command!r} before negotiation")
    if length - 1 < _NEGOTIATE_DATA:
        raise MilterFrameError(
            f"a negotiation of {length - 1} octets, not {_NEGOTIATE_DATA} (version, actions, "
            "protocol flags)"
        )
    version = int.from_bytes(frame[5:9], "big")
    if version < MIN_VERSION:
        raise MilterFrameError(f"protocol version {version}; masd needs {MIN_VERSION} or later")


def _opening_ready(inbox: SimpleBuffer) -> bool:
    """Whether ``inbox`` holds enough of the first frame for :func:`check_opening`."""
    if inbox.filled < 4:
        return False
    length = int.from_bytes(inbox[:4], "big")
    if length == 0:
        return True
    if inbox.filled < 5:
        return False
    return bytes(inbox[4:5]) != b"O" or inbox.filled >= 4 + min(length, 1 + _NEGOTIATE_DATA)


def reply_for(reply: LmtpReply, text: str) -> ResponseMessage:
    """The milter response for the LMTP RCPT reply ``reply``."""
    if reply is Replies.RECIPIENT_OK or reply is Replies.UNKNOWN_DOMAIN:
        return Continue()
    return ReplyCode(reply.line(text).encode("ascii") + b"\0")


def _text(value: bytes | memoryview) -> str:
    return bytes(value).decode("utf-8", "surrogateescape")


class MilterSession:
    """One MTA connection: the protocol state and the current message's size."""

    def __init__(self, rt: Runtime, store: StoreHandle, metrics: Metrics, max_bytes: int) -> None:
        self.rt = rt
        self.store = store
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.protocol = FilterProtocol()
        self.size = 0
        self.negotiated = False

    async def respond(self, message: MTAMessage) -> FilterMessage | None:
        """The answer to one message from the MTA (None: it expects none)."""
        match message:
            case Negotiate():
                return self._negotiate(message)
            case EnvelopeRecipient():
                rcpt = _text(message.recipient).strip().removeprefix("<").removesuffix(">")
                return await self._rcpt(rcpt)
            case EnvelopeFrom():
                self.size = 0
            case Header():
                self.size += len(message.name) + len(message.value) + 4  # ": ", CRLF
            case Body():
                self.size += len(message.content)
            case EndOfMessage():  # may carry the body's last piece
                self.size += len(message.content)
                return self._end_of_message()
            case Abort():
                self.size = 0
                return None
            case Macro() | Close():
                return None
        return Continue() if self.protocol.needs_response(message) else None

    def _negotiate(self, offer: Negotiate) -> Negotiate:
        wanted = ProtocolFlags(offer.protocol_flags & _NOT_NEEDED)
        return Negotiate(min(VERSION, offer.version), ActionFlags.NONE, wanted)

    async def _rcpt(self, rcpt: str) -> ResponseMessage:
        try:
            reply, text = await check_recipient(self.rt, self.store, rcpt)
        except Exception:
            log.exception("milter rcpt=%s: internal fault", rcpt)
            reply, text = Replies.FAULT, "temporary failure, try again later"
        self.metrics.inc(METRIC, stage="rcpt", outcome=reply.outcome)
        response = reply_for(reply, text)
        if isinstance(response, ReplyCode):
            log.info("milter rcpt=%s reply=%s detail=%s", rcpt, reply.code, text)
        return response

    def _end_of_message(self) -> ResponseMessage:
        size, self.size = self.size + 2, 0  # the empty line after the headers
        if size > self.max_bytes:
            reply = Replies.TOO_BIG
            text = f"message of {size} octets is over the limit of {self.max_bytes}"
            self.metrics.inc(METRIC, stage="eom", outcome=reply.outcome)
            log.info("milter message refused reply=%s detail=%s", reply.code, text)
            return ReplyCode(reply.line(text).encode("ascii") + b"\0")
        self.metrics.inc(METRIC, stage="eom", outcome="continue")
        return Continue()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read events, answer each, until the MTA closes or breaks the protocol."""
        inbox = SimpleBuffer(BUFFER_BYTES)
        outbox = SimpleBuffer(BUFFER_BYTES)
        while inbox.available:
            async with asyncio.timeout(IDLE_TIMEOUT):
                data = await reader.read(inbox.available)
            if not data:
                return
            inbox[:] = data
            if not self.negotiated:
                if not _opening_ready(inbox):
                    continue
                check_opening(inbox[:])
                self.negotiated = True
            for message in self.protocol.read_from(inbox):
                if isinstance(message, Close):
                    return
                response = await self.respond(message)
                if response is not None:
                    self.protocol.write_to(outbox, response)
                    writer.write(outbox[:].tobytes())
                    del outbox[:]
            await writer.drain()
            if inbox.filled >= 4 and int.from_bytes(inbox[:4], "big") + 4 > BUFFER_BYTES:
                break
        log.warning("milter client sent a message over %d octets; closing", BUFFER_BYTES)


class MilterServer(StreamListener):
    """The running listener; :meth:`close` also ends open MTA connections."""

    close_timeout = CLOSE_TIMEOUT

    def __init__(self, ctx: EdgeContext) -> None:
        super().__init__()
        self.rt = ctx.rt
        self.store = ctx.store
        self.metrics = ctx.metrics

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = MilterSession(
            self.rt, self.store, self.metrics, self.rt.config.server.max_message_bytes
        )
        with self.connection(writer):
            try:
                await session.serve(reader, writer)
            except (ConnectionError, TimeoutError):
                pass
            except MilterFrameError as exc:
                log.warning("milter closed a connection: %s", exc.detail)
            except (UnknownMessage, UnexpectedMessage, InvalidMessage, ValueError) as exc:
                log.warning("milter protocol error, closing the connection: %r", exc)
            except struct.error as exc:  # a frame too short for its fields
                log.warning("milter closed a connection: a malformed frame (%s)", exc)
            except Exception:
                log.exception("milter connection fault")
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


async def start_milter(
    listen: Listen | None,
    server: MilterServer,
    *,
    sock: socket.socket | None = None,
    max_connections: int = MAX_CONNECTIONS,
) -> MilterServer:
    """Bind ``listen`` (or serve the inherited listening ``sock``) and start answering.

    A unix socket gets mode 0660 before it accepts anyone (the MTA must be in
    the socket's group).  A connection beyond ``max_connections`` is closed as
    it is accepted (the MTA applies its default action).
    """
    loop = asyncio.get_running_loop()

    def connection() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(
            asyncio.StreamReader(loop=loop), server.client, loop=loop
        )

    if listen is None and sock is None:
        raise MilterListenError("no milter listener configured (server.milter)")
    gate = Gate(
        connection,
        name="milter",
        limit=max_connections,
        refusal=b"",  # nothing but a negotiation may come first: just the close
        on_refused=lambda: server.metrics.inc("masd_connections_refused_total", listener="milter"),
    )
    server.server = await serve(gate, listen, sock=sock, error=MilterListenError)
    return server
