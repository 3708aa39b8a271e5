"""The LMTP session on top of aiosmtpd: the one module that knows aiosmtpd's insides.

Built on aiosmtpd's ``LMTP`` protocol, served by :func:`masd.edges.lmtp.start_lmtp`
(never aiosmtpd's Controller).  What aiosmtpd does not do for LMTP is fixed
in :class:`LmtpProtocol`:

- after DATA, every reply is one line per accepted recipient (RFC 2033
  §4.2), the refusal of data over the size limit included (aiosmtpd sends
  its "too much mail data" once; Postfix would then read the other
  recipients' replies out of step);
- LHLO advertises PIPELINING and ENHANCEDSTATUSCODES (RFC 2033 §4.1), and
  every reply but the greeting, LHLO and 354 carries an enhanced status code
  (RFC 2034 §3), aiosmtpd's own ones included;
- a fault anywhere in DATA handling is ``451 4.3.0`` for each recipient;
- MAIL FROM and RCPT TO paths of the plain form ``<local@domain>`` are read
  with one regular expression (:func:`plain_path`); aiosmtpd's own parser
  (the email package's header parser, and a class defined per call) took a
  quarter of masd's CPU at intake, and still reads every other form;
- the message after DATA is read in large pieces up to the end-of-data line
  (:func:`masd.edges.lmtp_data.read_data`), not one line per ``await`` as aiosmtpd does, in time
  linear in its length whatever its lines, with the
  same size limit; a line of the data may be of any length (aiosmtpd refuses
  one over 1000 octets: masd never refuses a mail for its content,
  docs/protocol.md §3), while a command line keeps aiosmtpd's limits;
- a reply is written without waiting on the writer unless its buffer is
  past the transport's high-water mark (aiosmtpd awaits a drain after every
  reply), and a reply to a command that a pipelining client followed with more
  (the next command already read) waits to go out with the next reply: the
  replies to a mail's ``MAIL``, ``RCPT`` and ``DATA`` are one write;
- a session that makes no progress (no command, no data) for the idle
  timeout is closed (docs/protocol.md §3, RFC 5321 §4.5.3.2); while masd itself works
  on the data the clock is stopped.  Closing inside DATA records nothing.

The session's state is one :class:`~masd.edges.lmtp_state.State`, moved
through the table of :mod:`masd.edges.lmtp_state`; it decides what each
reply is.  The answer to the data is made from a reply kind
(:class:`~masd.edges.lmtp_replies.Replies`), never read back from a reply's
text.

aiosmtpd's private names (underscore attributes and methods) that this
module overrides or reads are listed in :data:`PRIVATE_METHODS` and
:data:`PRIVATE_ATTRIBUTES`; no other module of masd uses any.  Of asyncio's,
:func:`~masd.edges.lmtp_data.read_data` puts back what it read past the data through a stream
reader's buffer, and :class:`_MailReader` pauses the reading by its own bound, not the
reader's limit.
:func:`missing_private_names` checks them against the installed aiosmtpd
(the version range in pyproject.toml is the one it was checked with).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, AnyStr, Final, SupportsIndex, assert_never

import aiosmtpd.smtp
from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP, syntax

from masd.edges.lmtp_data import read_data
from masd.edges.lmtp_replies import RecipientReplies, Replies, ReplyCode, size_refusal
from masd.edges.lmtp_state import IN_DATA, Event, State, next_state
from masd.logs import shown

if TYPE_CHECKING:
    from typing import Protocol

    class Handler(Protocol):
        """What the session needs of :class:`masd.edges.lmtp.LmtpHandler`."""

        @property
        def size_limit(self) -> int | None: ...

        def per_recipient(
            self, reply: ReplyCode, text: str, rcpts: Sequence[str]
        ) -> RecipientReplies: ...


log = logging.getLogger("masd.lmtp")

#: Methods of aiosmtpd's ``SMTP`` that :class:`LmtpProtocol` overrides or calls.
PRIVATE_METHODS: Final = ("_getaddr", "_reset_timeout", "_create_envelope", "_call_handler_hook")
#: Attributes of a connected aiosmtpd ``SMTP`` that :class:`LmtpProtocol` reads or sets.
PRIVATE_ATTRIBUTES: Final = (
    "_timeout_handle",
    "_timeout_duration",
    "_reader",
    "_writer",
    "_stream_reader",
)


#: Enhanced codes for replies aiosmtpd writes itself without one (RFC 3463).
_LIBRARY_ENHANCED: Final = {
    221: "2.0.0",
    250: "2.0.0",
    252: "2.5.0",
    500: "5.5.2",
    501: "5.5.4",
    502: "5.5.1",
    503: "5.5.1",
    504: "5.5.4",
    530: "5.7.0",
    552: "5.3.4",
    553: "5.1.3",
    554: "5.0.0",
    555: "5.5.4",
}
_HAS_ENHANCED = re.compile(r"[0-9]{3}[ -][245]\.[0-9]{1,3}\.[0-9]{1,3}(?: |$)")
_REPLY_LINE = re.compile(r"([0-9]{3})([ -]?)(.*)", re.DOTALL)


@lru_cache(maxsize=512)
def _with_enhanced(status: str) -> str:
    out: list[str] = []
    for line in status.split("\r\n"):
        match = _REPLY_LINE.fullmatch(line)
        if match is None or _HAS_ENHANCED.match(line):
            out.append(line)
            continue
        code, sep, text = match.groups()
        enhanced = _LIBRARY_ENHANCED.get(int(code), f"{code[0]}.0.0")
        out.append(f"{code}{sep or ' '}{enhanced} {text.strip()}".rstrip())
    return "\r\n".join(out)


#: RFC 5321 §4.1.2 ``Path`` in its plain form: ``"<" Dot-string "@" Domain ">"``,
#: ASCII only, no source route, no quoted local part, no address literal,
#: then nothing or whitespace and the parameters.
_PLAIN_PATH: Final = re.compile(
    r"<((?:[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+\.)*[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
    r"@(?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]+)>(?:[ \t]+([^( \t][^(]*)?)?"
)


def plain_path(arg: str) -> tuple[str, str] | None:
    """``(address, parameters)`` for a plain ``<local@domain> [params]``, else None.

    Where it answers, it answers exactly what aiosmtpd's ``SMTP._getaddr``
    does (tests/test_lmtp_path.py checks that against aiosmtpd itself); None
    means "not plain": the caller hands the argument to aiosmtpd's parser,
    which reads the rest of what it accepts (quoted local parts, routes,
    literals, UTF-8, the null path) as it always did.
    """
    match = _PLAIN_PATH.fullmatch(arg)
    if match is None:
        return None
    return match.group(1), match.group(2) or ""


#: aiosmtpd's reader limit (``SMTP.line_length_limit``): the longest command line it
#: reads, its CR LF included.  Data lines are not held to it
#: (:func:`masd.edges.lmtp_data.read_data`).
LINE_LIMIT: Final = 1001


_SANITIZED_LOG: Final = aiosmtpd.smtp.sanitized_log
_MAIL_LOG: Final = aiosmtpd.smtp.log


def _sanitized_log_if_enabled(func: Any, msg: Any, *args: Any, **kwargs: Any) -> None:
    """aiosmtpd's ``sanitized_log``, skipped when its logger writes neither INFO nor DEBUG.

    aiosmtpd calls it twice for every command line, with ``mail.log``'s
    ``debug`` or ``info``, and it masks AUTH data and builds its arguments
    before the logger's level is looked at; masd keeps ``mail.log`` at
    WARNING (:func:`masd.logs.configure_logging`).
    """
    if getattr(func, "__self__", None) is _MAIL_LOG and not _MAIL_LOG.isEnabledFor(logging.INFO):
        return
    _SANITIZED_LOG(func, msg, *args, **kwargs)


def lazy_command_log() -> None:
    """Make aiosmtpd look at the logger's level before it masks a command line to log."""
    aiosmtpd.smtp.sanitized_log = _sanitized_log_if_enabled


#: Replies held to go out together stop being held past this many octets (then the writer's
#: own high-water mark bounds what waits for a client that does not read).
HOLD_BYTES: Final = 4096
#: Replies after which the session closes: written at once, whatever else came.
_CLOSING: Final = (b"221", b"421")
#: How much a session's stream reader holds before reading from the connection pauses.
PAUSE_BYTES: Final = 1 << 18


class _MailReader(asyncio.StreamReader):
    """aiosmtpd's stream reader, whose limit bounds a command line (LINE_LIMIT): reading
    pauses only past :data:`PAUSE_BYTES` held, not past twice that limit, which every mail
    over 2,002 octets passed (a pause and a resume of the connection's reading per mail)."""

    _limit: int

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        line_limit, self._limit = self._limit, PAUSE_BYTES // 2
        try:
            super().feed_data(data)
        finally:
            self._limit = line_limit

    def holds_line(self) -> bool:
        """A whole line has come and not been read yet (a client's next command, pipelined)."""
        return b"\n" in self._buffer  # type: ignore[attr-defined]  # asyncio's, unlisted

    def _maybe_resume_transport(self) -> None:
        line_limit, self._limit = self._limit, PAUSE_BYTES // 2
        try:
            super()._maybe_resume_transport()  # type: ignore[misc]  # asyncio's, unlisted
        finally:
            self._limit = line_limit


class LmtpProtocol(LMTP):
    """aiosmtpd's LMTP with the fixes above; ``timeout`` is the idle timeout."""

    def __init__(self, handler: Handler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        # aiosmtpd makes a plain reader here; it becomes one that pauses past a mail.
        reader = getattr(self, "_stream_reader", None)
        if type(reader) is asyncio.StreamReader:
            reader.__class__ = _MailReader
        lazy_command_log()
        self.masd_handler = handler
        self._state = State.GREETING
        self._data_rcpts: list[str] = []  # the recipients the answer to the data is for
        self._idle_until = 0.0  # loop time after which an idle session is closed
        self._idle_armed = False  # a check is scheduled (self._timeout_handle)
        self._held: list[bytes] = []  # replies kept to go out with the next (see _write)
        self._held_bytes = 0

    @property
    def state(self) -> State:
        """Where the session stands (:mod:`masd.edges.lmtp_state`)."""
        return self._state

    def _move(self, event: Event) -> None:
        self._state = next_state(self._state, event)

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        plain = plain_path(arg)
        if plain is None:
            return super()._getaddr(arg)
        limit = self.local_part_limit
        if limit and len(plain[0].rpartition("@")[0]) > limit:
            return None, None
        return plain

    def _reset_timeout(self, duration: float | None = None) -> None:
        # aiosmtpd cancels and schedules a timer on every command; here a
        # command only moves the idle deadline, and one scheduled check
        # closes the session once it has passed.
        self._idle_until = self.loop.time() + (duration or self._timeout_duration)
        handle = self._timeout_handle
        if handle is None or not self._idle_armed or handle.when() > self._idle_until:
            if handle is not None:
                handle.cancel()
            self._timeout_handle = self.loop.call_at(self._idle_until, self._idle_check)
            self._idle_armed = True

    def _idle_check(self) -> None:
        self._idle_armed = False
        if self._state is State.RECORDING:
            self._reset_timeout()
            return
        if self.loop.time() < self._idle_until:
            self._timeout_handle = self.loop.call_at(self._idle_until, self._idle_check)
            self._idle_armed = True
            return
        log.info(
            "LMTP session made no progress for %g s; closed peer=%s",
            self._timeout_duration,
            shown(self.session and self.session.peer),
        )
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        # Inside the mail data every octet is progress (RFC 5321 §4.5.3.2.5
        # times each read); elsewhere only a whole command is.
        if self._state in IN_DATA:
            self._reset_timeout()
        super().data_received(data)

    async def smtp_LHLO(self, arg: str) -> None:
        self._move(Event.LHLO)
        try:
            await super().smtp_LHLO(arg)
        finally:
            self._move(Event.LHLO_DONE)

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:
        try:
            await self._data(arg)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            if self._state not in IN_DATA:
                raise
            log.exception("LMTP DATA fault")
            self.envelope = self._create_envelope()
            await self.push(self._fault_replies())
        finally:
            if self._state in IN_DATA:
                self._move(Event.DATA_ENDED)

    async def _data(self, arg: str) -> None:
        """aiosmtpd's DATA command with the data read by :func:`read_data`."""
        if await self.check_helo_needed() or await self.check_auth_needed("DATA"):
            return
        assert self.envelope is not None
        if not self.envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        self._data_rcpts = list(self.envelope.rcpt_tos)
        self._move(Event.GO_AHEAD)
        await self._write("354 End data with <CR><LF>.<CR><LF>")  # as it is: no enhanced code
        try:
            data = await read_data(self._reader, self.data_size_limit)
        except asyncio.IncompleteReadError as exc:
            # The client closed the connection inside the data: nothing is
            # recorded and nothing answered (its MTA keeps the mail queued).
            self._writer.close()
            raise ConnectionResetError("connection closed during DATA") from exc
        except asyncio.CancelledError:
            self._writer.close()  # the connection was lost (aiosmtpd cancels us)
            raise
        if data.too_much:
            await self.push(self._too_big(data.size))
            self.envelope = self._create_envelope()
            return
        self.envelope.content = self.envelope.original_content = data.content
        self._move(Event.DATA_READ)
        try:
            status = await self._call_handler_hook("DATA")
        finally:
            self._reset_timeout()
        self.envelope = self._create_envelope()
        await self.push(status)

    async def push(self, status: AnyStr) -> None:
        await self._write(self._lmtp_reply(status) if isinstance(status, str) else status)

    async def _write(self, reply: str | bytes) -> None:
        """aiosmtpd's ``push`` without its wait: the reply is written, and the writer
        drained only when its buffer is over the transport's high-water mark or the
        connection is closing (where draining raises); aiosmtpd awaited a drain for
        every reply, a coroutine and its checks four times a mail."""
        if isinstance(reply, str):
            reply = reply.encode("utf-8" if self.enable_SMTPUTF8 else "ascii")
        reader = self._reader
        more = isinstance(reader, _MailReader) and reader.holds_line()
        hold = (more and not reply.startswith(_CLOSING)) or reply[3:4] == b"-"
        if hold and self._held_bytes < HOLD_BYTES:
            # The client's next command came already (pipelined, RFC 2920), or this is a line
            # of a reply with more to come (aiosmtpd pushes LHLO's a line at a time): it goes
            # out with the next, in one write.
            self._held.append(reply + b"\r\n")
            self._held_bytes += len(reply) + 2
            return
        if self._held:
            reply = b"".join(self._held) + reply
            self._held.clear()
            self._held_bytes = 0
        self._writer.write(reply + b"\r\n")
        if _MAIL_LOG.isEnabledFor(logging.DEBUG):
            _MAIL_LOG.debug("%r << %r", self.session and self.session.peer, reply)
        transport = self._writer.transport
        if (
            self.transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]
        ):
            await self._writer.drain()

    def _fault_replies(self) -> RecipientReplies:
        return self.masd_handler.per_recipient(
            Replies.FAULT, "temporary failure, try again later", self._data_rcpts
        )

    def _too_big(self, size: int) -> RecipientReplies:
        """The answer to data of ``size`` octets over the size limit, the one limit
        on the data, for each recipient (docs/protocol.md §3)."""
        rcpts = self._data_rcpts
        handler = self.masd_handler
        limit = handler.size_limit or 0
        text = size_refusal(size, limit)
        assert text is not None  # read_data refuses only data over a limit
        log.info("message refused: %d octets, over %d; %d recipients", size, limit, len(rcpts))
        return handler.per_recipient(Replies.TOO_BIG, text, rcpts)

    def _lmtp_reply(self, status: str) -> str:
        match self._state:
            case State.GREETING:
                self._move(Event.GREETED)
                return status
            case State.LHLO:
                return status
            case State.DATA | State.RECORDING:
                # The answer to the data: it must be one line per recipient.
                self._move(Event.ANSWERED)
                if isinstance(status, RecipientReplies):
                    return status
                log.error("unexpected reply to DATA %r; answered 451 for each recipient", status)
                return self._fault_replies()
            case State.COMMANDS:
                return _with_enhanced(status)
            case _:
                assert_never(self._state)


async def missing_private_names(
    methods: Sequence[str] = PRIVATE_METHODS, attributes: Sequence[str] = PRIVATE_ATTRIBUTES
) -> list[str]:
    """The private names above that the installed aiosmtpd lacks ([] when all are there).

    Methods are looked up on aiosmtpd's ``LMTP`` class; attributes on a real
    session, connected over a socket pair (aiosmtpd sets them on connect).
    """
    missing = [f"SMTP.{n}" for n in methods if not callable(getattr(LMTP, n, None))]
    if not isinstance(getattr(asyncio.StreamReader(), "_buffer", None), bytearray):
        missing.append("asyncio.StreamReader()._buffer")  # read_data gives back through it
    if not isinstance(getattr(asyncio.StreamReader(), "_limit", None), int):
        missing.append("asyncio.StreamReader()._limit")  # _MailReader pauses by its own
    if not callable(getattr(asyncio.StreamReader, "_maybe_resume_transport", None)):
        missing.append("asyncio.StreamReader._maybe_resume_transport")
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    sessions: list[SMTP] = []

    def factory() -> SMTP:
        sessions.append(LMTP(object(), hostname="probe", loop=loop))
        return sessions[-1]

    try:
        transport, _ = await loop.create_connection(factory, sock=ours)
        try:
            missing += [f"SMTP().{n}" for n in attributes if not hasattr(sessions[0], n)]
        finally:
            transport.close()
            for _ in range(5):  # let the session's task see the close and end
                await asyncio.sleep(0)
    finally:
        theirs.close()
        with contextlib.suppress(OSError):
            ours.close()
    return missing


def read_path(session: SMTP, arg: str) -> tuple[str | None, str | None]:
    """How ``session`` reads the path of a MAIL or RCPT argument: ``(address, params)``,
    ``(None, None)`` when it does not parse (aiosmtpd's reader, or masd's override)."""
    return session._getaddr(arg)
