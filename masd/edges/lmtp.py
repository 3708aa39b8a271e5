"""The LMTP listener: Postfix hands mail to masd here (PROFILE §2).

Built on aiosmtpd's ``LMTP`` protocol, served with ``loop.create_server`` /
``create_unix_server`` (never aiosmtpd's Controller).  What aiosmtpd does not
do for LMTP is fixed in :class:`_LmtpProtocol`:

- after DATA, every reply is one line per accepted recipient (RFC 2033
  §4.2), including aiosmtpd's own "too much mail data" and "line too long"
  answers, which it sends once (Postfix would then read the other
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
  (:func:`read_data`), not one line per ``await`` as aiosmtpd does, with the
  same limits and answers.

Recipients are checked at RCPT so Postfix can refuse at SMTP time; the mail
is recorded per recipient at DATA, each in its own store job, concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, AnyStr, Final

from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP, Envelope, Session, syntax

from masd import service
from masd.config import Listen, TcpListen, UnixListen
from masd.core.address import Address, parse_address
from masd.core.errors import AddressError, MasdError
from masd.core.event import ParsedMail, build_event
from masd.core.trust import TrustSettings
from masd.edges.context import EdgeContext
from masd.service import Runtime, UnknownCase
from masd.store import Store

log = logging.getLogger("masd.lmtp")

#: Idle time allowed between commands; the DATA transfer and its processing
#: must also fit in it (aiosmtpd restarts the timer on each command only).
#: Postfix waits up to 600 s for the replies after DATA (lmtp_data_done_timeout).
IDLE_TIMEOUT: Final = 300.0
#: Messages at least this large are parsed on a worker thread, not on the loop.
THREAD_PARSE_BYTES: Final = 256 * 1024
#: Longest detail text put in a reply line (RFC 5321 §4.5.3.1.5: 512 octets a line).
MAX_DETAIL: Final = 400
SOCKET_MODE: Final = 0o660
METRIC: Final = "masd_deliveries_total"


@dataclass(frozen=True)
class ReplyCode:
    """One kind of LMTP reply: code, RFC 3463 enhanced code, metrics outcome."""

    code: int
    enhanced: str
    outcome: str

    def line(self, text: str) -> str:
        return f"{self.code} {self.enhanced} {_printable(text)}"


class Replies:
    """Every reply masd makes itself (PROFILE §2 for recipients)."""

    SENDER_OK: Final = ReplyCode(250, "2.1.0", "sender-ok")
    BAD_SENDER: Final = ReplyCode(501, "5.1.7", "bad-sender")
    RECIPIENT_OK: Final = ReplyCode(250, "2.1.5", "recipient-ok")
    RECORDED: Final = ReplyCode(250, "2.0.0", "recorded")
    DUPLICATE: Final = ReplyCode(250, "2.0.0", "duplicate")
    UNKNOWN_DOMAIN: Final = ReplyCode(550, "5.1.2", "unknown-domain")
    BAD_ADDRESS: Final = ReplyCode(550, "5.1.1", "bad-address")
    UNKNOWN_TYPE: Final = ReplyCode(550, "5.1.1", "unknown-type")
    UNKNOWN_CASE: Final = ReplyCode(550, "5.1.1", "unknown-case")
    TOO_BIG: Final = ReplyCode(552, "5.3.4", "too-big")
    LINE_TOO_LONG: Final = ReplyCode(554, "5.6.0", "line-too-long")
    FAULT: Final = ReplyCode(451, "4.3.0", "fault")


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


_PRINTABLE: Final = re.compile(r"[ -~]*")


def _printable(text: str) -> str:
    """One ASCII line: replies never carry line breaks, controls or raw UTF-8."""
    if len(text) <= MAX_DETAIL and _PRINTABLE.fullmatch(text):
        return text  # the usual case, left as it is
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(ch if " " <= ch <= "~" else " " for ch in text)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


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


class RecipientReplies(str):
    """The reply to DATA: one line per accepted recipient, joined with CRLF."""

    __slots__ = ()


def received_at(now: float) -> str:
    """RFC 3339 UTC timestamp, millisecond precision."""
    return (
        datetime.fromtimestamp(now, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _undecodable(address: str) -> bool:
    """aiosmtpd hands on bytes that are not UTF-8 as lone surrogates."""
    return not address.isascii() and any("\udc80" <= ch <= "\udcff" for ch in address)


def _sender(mail_from: str | None) -> str:
    return "" if mail_from in (None, "", "<>") else str(mail_from)


class LmtpHandler:
    """Recipient checks at RCPT, recording at DATA (aiosmtpd's ``handle_*`` hooks)."""

    def __init__(self, ctx: EdgeContext) -> None:
        rt = self.rt = ctx.rt
        self.store = ctx.store
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.on_commit = ctx.listener
        server = rt.config.server
        self._delimiter = server.recipient_delimiter
        self._domains = rt.config.domains
        self._trust = TrustSettings(
            frozenset(server.trusted_authserv_ids), frozenset(server.trusted_hosts)
        )
        self.size_limit = server.max_message_bytes
        self._inflight: set[asyncio.Task[str]] = set()

    # -- aiosmtpd hooks -------------------------------------------------------

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        # LHLO goes through aiosmtpd's EHLO; a hook must record the client's name.
        session.host_name = hostname
        keywords = [r[4:] for r in responses[1:] if r[4:] != "HELP"]
        for wanted in ("PIPELINING", "ENHANCEDSTATUSCODES"):
            if wanted not in keywords:
                keywords.insert(0, wanted)
        lines = [responses[0][4:], *keywords]
        return [f"250-{x}" for x in lines[:-1]] + [f"250 {lines[-1]}"]

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        if _undecodable(address):
            return Replies.BAD_SENDER.line(f"sender {address!r} is not UTF-8")
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return Replies.SENDER_OK.line("sender ok")

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        try:
            reply, text = await self.check_recipient(address)
        except Exception:
            log.exception("rcpt=%s refused: internal fault", address)
            reply, text = Replies.FAULT, "temporary failure, try again later"
        if reply is Replies.RECIPIENT_OK:
            envelope.rcpt_tos.append(address)
            envelope.rcpt_options.extend(rcpt_options)
        else:
            self.metrics.inc(METRIC, outcome=reply.outcome)
            log.info("rcpt=%s refused reply=%s detail=%s", address, reply.code, text)
        return reply.line(text)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        # The work runs in its own task: if Postfix drops the connection while
        # we wait, the recording still finishes and on_commit still fires.
        task = asyncio.ensure_future(
            self.record(
                envelope.original_content or b"",
                _sender(envelope.mail_from),
                list(envelope.rcpt_tos),
            )
        )
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    async def handle_exception(self, error: Exception) -> str:
        log.error("LMTP session fault", exc_info=error)
        return Replies.FAULT.line("temporary failure, try again later")

    # -- the work ---------------------------------------------------------------

    def parse(self, rcpt: str) -> Address:
        return parse_address(rcpt, delimiter=self._delimiter, domains=self._domains)

    async def check_recipient(self, rcpt: str) -> tuple[ReplyCode, str]:
        """PROFILE §2 at RCPT: would a mail to ``rcpt`` be recorded?"""
        return await check_recipient(self.rt, self.store, rcpt)

    async def record(self, raw: bytes, mail_from: str, rcpts: Sequence[str]) -> RecipientReplies:
        """Record one message for each recipient; the reply lines, in order.  Never raises."""
        try:
            now = self.clock.now()
            parsed, sha = await self._parse_mail(raw, mail_from, rcpts[0], now)
        except Exception:
            log.exception(
                "mail from=%s to %d recipients: cannot read the message", mail_from, len(rcpts)
            )
            return self.per_recipient(Replies.FAULT, "temporary failure, try again later", rcpts)
        if len(rcpts) == 1:  # the usual case: no task and gather for one recipient
            results = [await self._record_one(rcpts[0], parsed, raw, sha, now, True)]
        else:
            results = await asyncio.gather(
                *(
                    self._record_one(rcpt, parsed, raw, sha, now, i == 0)
                    for i, rcpt in enumerate(rcpts)
                )
            )
        woke = [wakes for _, wakes in results if wakes is not None]
        if woke:
            try:
                self.on_commit.committed(service.Wakes.union(woke))
            except Exception:
                log.exception("on_commit failed after a delivery")
        return RecipientReplies("\r\n".join(line for line, _ in results))

    def per_recipient(self, reply: ReplyCode, text: str, rcpts: Sequence[str]) -> RecipientReplies:
        for _ in rcpts:
            self.metrics.inc(METRIC, outcome=reply.outcome)
        return RecipientReplies("\r\n".join(reply.line(text) for _ in rcpts))

    async def _parse_mail(
        self, raw: bytes, mail_from: str, rcpt: str, now: float
    ) -> tuple[ParsedMail, str]:
        def work() -> tuple[ParsedMail, str]:
            parsed = build_event(
                raw,
                mail_from=mail_from,
                rcpt_to=rcpt,
                received_at=received_at(now),
                message_ref=new_message_ref(now),
                trust=self._trust,
            )
            return parsed, hashlib.sha256(raw).hexdigest()

        if len(raw) >= THREAD_PARSE_BYTES:
            return await asyncio.to_thread(work)
        return work()

    async def _record_one(
        self, rcpt: str, first: ParsedMail, raw: bytes, sha: str, now: float, is_first: bool
    ) -> tuple[str, service.Wakes | None]:
        """One recipient: (reply line, what its committed job woke; None: nothing committed)."""
        try:
            addr = self.parse(rcpt)
            # The message is parsed once; each recipient's event differs only
            # in rcpt_to and its own message_ref.
            mail = first
            if not is_first:
                event = dataclasses.replace(
                    first.event, rcpt_to=rcpt, message_ref=new_message_ref(now)
                )
                mail = dataclasses.replace(first, event=event)
            done = await self.store.write(
                lambda db: service.deliver(self.rt, db, addr, mail, raw, sha, now)
            )
        except UnknownCase as exc:
            reply, text = Replies.UNKNOWN_CASE, exc.detail
        except AddressError as exc:
            reply, text = _address_refusal(exc), exc.detail
        except MasdError as exc:
            log.error("rcpt=%s not recorded: %s", rcpt, exc, exc_info=exc)
            reply, text = Replies.FAULT, f"temporary failure ({exc.code}), try again later"
        except Exception as exc:
            log.error("rcpt=%s not recorded: internal fault", rcpt, exc_info=exc)
            reply, text = Replies.FAULT, "temporary failure, try again later"
        else:
            reply = Replies.DUPLICATE if done.duplicate else Replies.RECORDED
            text = f"{done.message_ref} {'already recorded' if done.duplicate else 'recorded'}"
            log.info(
                "rcpt=%s key=%s message_ref=%s message_id=%s outcome=%s",
                rcpt,
                done.case_key,
                done.message_ref,
                mail.event.message_id,
                reply.outcome,
            )
            self.metrics.inc(METRIC, outcome=reply.outcome)
            return reply.line(text), done.wakes
        if reply is not Replies.FAULT:
            log.info("rcpt=%s refused at DATA reply=%s detail=%s", rcpt, reply.code, text)
        self.metrics.inc(METRIC, outcome=reply.outcome)
        return reply.line(text), None

    @property
    def in_flight(self) -> int:
        """Messages being recorded right now (their sessions may be gone)."""
        return len(self._inflight)

    async def drain(self) -> None:
        """Wait until every recording in flight has finished (for shutdown)."""
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)


async def check_recipient(rt: Runtime, store: Store, rcpt: str) -> tuple[ReplyCode, str]:
    """PROFILE §2 at RCPT: would a mail to ``rcpt`` be recorded?  Never raises.

    The reply masd gives at LMTP RCPT, and the one the policy listener turns
    into a Postfix access action, so both refuse the same recipients.
    """
    if _undecodable(rcpt):
        return Replies.BAD_ADDRESS, f"address: {rcpt!r} is not UTF-8"
    config = rt.config
    try:
        addr = parse_address(
            rcpt, delimiter=config.server.recipient_delimiter, domains=config.domains
        )
    except AddressError as exc:
        return _address_refusal(exc), exc.detail
    typ = config.type_for(addr.domain, addr.type)
    if typ is None:
        return Replies.UNKNOWN_TYPE, f"type: no type {addr.type!r} at {addr.domain}"
    if addr.kind == "resource":
        try:
            exists = await store.read(lambda db: service.case_exists(db, addr.key))
        except Exception:
            log.exception("rcpt=%s key=%s store fault at RCPT", rcpt, addr.key)
            return Replies.FAULT, "store unavailable, try again later"
        if not exists:
            return Replies.UNKNOWN_CASE, f"id: no case {addr.canonical}"
    return Replies.RECIPIENT_OK, f"{addr.canonical} ok"


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


#: RFC 5321 §4.1.1.4: the mail data ends with a line holding one dot.
_END: Final = b"\r\n.\r\n"
#: Longest data line aiosmtpd accepts, its CR LF included (``SMTP.line_length_limit``).
LINE_LIMIT: Final = 1001


@dataclass(frozen=True)
class Data:
    """What :func:`read_data` read: the message, or why it was refused."""

    content: bytes = b""
    too_long: bool = False  # a line over LINE_LIMIT octets with its CR LF (answered 500)
    too_much: bool = False  # over the size limit (answered 552)


def _partial_end(tail: bytes | bytearray) -> int:
    """How many octets at the end of ``tail`` begin the end-of-data sequence."""
    for size in (4, 3, 2, 1):
        if tail[-size:] == _END[:size]:
            return size
    return 0


def _first_refusal(body: bytes | bytearray, size_limit: int | None) -> Data:
    """Which limit the data passed first, line by line, as aiosmtpd counts.

    A line longer than the reader's limit (LINE_LIMIT octets without its end)
    is refused before it is counted; other lines are counted, then measured.
    """
    total = 0
    lines = bytes(body[2:]).split(b"\r\n")
    for i, line in enumerate(lines):
        if len(line) > LINE_LIMIT:
            return Data(too_long=True)
        if i == len(lines) - 1:
            break  # not ended by CR LF (yet): not counted
        total += len(line) + 2
        if size_limit and total > size_limit:
            return Data(too_much=True)
        if len(line) + 2 > LINE_LIMIT:
            return Data(too_long=True)
    return Data(too_much=True)


async def read_data(reader: asyncio.StreamReader, size_limit: int | None) -> Data:
    """Read mail data up to the end-of-data line, in pieces as large as the buffer.

    The stream is read as if a CR LF came before it (the DATA command's own
    line end), so data that is only "." is an empty message.  Nothing after
    the end-of-data line is consumed: a pipelining client's next command
    stays in the reader.  The limits and answers are aiosmtpd's: a line over
    :data:`LINE_LIMIT` octets with its CR LF is ``too_long``, more than
    ``size_limit`` octets ``too_much`` (whichever the data reaches first),
    and refused data is still read to its end but not kept.  A leading dot
    is removed from each line (RFC 5321 §4.5.2).
    """
    body = bytearray(b"\r\n")
    size = 0  # octets read after the leading CR LF
    refused: Data | None = None
    while True:
        partial = _partial_end(body)
        if partial:
            # What was read may end inside the end-of-data sequence: read
            # exactly the rest of it, never beyond.
            piece = await reader.readexactly(len(_END) - partial)
        else:
            try:
                piece = await reader.readuntil(_END)
            except asyncio.LimitOverrunError as exc:
                piece = await reader.read(exc.consumed)
        body += piece
        size += len(piece)
        ended = body.endswith(_END)
        if refused is None and size_limit and size - 3 > size_limit:
            refused = _first_refusal(body, size_limit)
        if ended:
            break
        if refused is not None:
            # Keep only what finding the end-of-data sequence needs.
            del body[: -(len(_END) - 1)]
    if refused is not None:
        return refused
    content = bytes(body[:-3])  # the final ".\r\n" off; the leading CR LF still on
    if max(map(len, content.split(b"\r\n"))) + 2 > LINE_LIMIT:
        return _first_refusal(content, size_limit)
    return Data(content=content.replace(b"\r\n.", b"\r\n")[2:])


def new_message_ref(now: float) -> str:
    """``msg-`` and 32 hex digits: the time in milliseconds (12), then 80 random bits.

    The time comes first so that a new message's key sorts after the ones
    before it: inserts into the ``messages`` primary key land on its right
    edge, not on a random page of an index that outgrows SQLite's cache
    (docs/performance.md, "Scale").  The random part keeps keys unique.
    """
    millis = int(now * 1000) % (1 << 48)
    return f"msg-{millis:012x}{secrets.token_hex(10)}"


def _address_refusal(exc: AddressError) -> ReplyCode:
    return Replies.UNKNOWN_DOMAIN if exc.code == "unknown-domain" else Replies.BAD_ADDRESS


class _LmtpProtocol(LMTP):
    """aiosmtpd's LMTP with the per-recipient and enhanced-code fixes above."""

    def __init__(self, handler: LmtpHandler, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.masd_handler = handler
        self._in_lhlo = False
        self._data_open = False  # between our 354 and the replies to the data
        self._data_rcpts: list[str] = []
        self._idle_until = 0.0  # loop time after which an idle session is closed
        self._idle_armed = False  # a check is scheduled (self._timeout_handle)

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
        if self.loop.time() < self._idle_until:
            self._timeout_handle = self.loop.call_at(self._idle_until, self._idle_check)
            self._idle_armed = True
            return
        log.info("LMTP session idle too long, closed peer=%s", self.session and self.session.peer)
        if self.transport is not None:
            self.transport.close()

    async def smtp_LHLO(self, arg: str) -> None:
        self._in_lhlo = True
        try:
            await super().smtp_LHLO(arg)
        finally:
            self._in_lhlo = False

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:
        try:
            await self._data(arg)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            if not self._data_open:
                raise
            log.exception("LMTP DATA fault")
            self.envelope = self._create_envelope()
            await self.push(self._fault_replies())
        finally:
            self._data_open = False

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
        await self.push("354 End data with <CR><LF>.<CR><LF>")
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
        if data.too_long or data.too_much:
            await self.push(
                "500 Line too long (see RFC5321 4.5.3.1.6)"
                if data.too_long
                else "552 Error: Too much mail data"
            )
            self.envelope = self._create_envelope()
            return
        self.envelope.content = self.envelope.original_content = data.content
        status = await self._call_handler_hook("DATA")
        self.envelope = self._create_envelope()
        await self.push(status)

    async def push(self, status: AnyStr) -> None:
        if isinstance(status, str):
            await super().push(self._lmtp_reply(status))
        else:
            await super().push(status)

    def _fault_replies(self) -> RecipientReplies:
        return self.masd_handler.per_recipient(
            Replies.FAULT, "temporary failure, try again later", self._data_rcpts
        )

    def _lmtp_reply(self, status: str) -> str:
        if self._data_open:
            # The answer to the data: it must be one line per recipient.
            self._data_open = False
            if isinstance(status, RecipientReplies):
                return status
            rcpts = self._data_rcpts
            code = status[:3]
            handler = self.masd_handler
            if code == "552":
                limit = handler.size_limit
                text = f"message over {limit} octets (server.max_message_bytes)"
                log.info("message refused: over %d octets, %d recipients", limit, len(rcpts))
                return handler.per_recipient(Replies.TOO_BIG, text, rcpts)
            if code == "500" and "too long" in status.lower():
                text = "a line over 1000 octets (RFC 5321 4.5.3.1.6)"
                log.info("message refused: line too long, %d recipients", len(rcpts))
                return handler.per_recipient(Replies.LINE_TOO_LONG, text, rcpts)
            log.error("unexpected reply to DATA %r; answered 451 for each recipient", status)
            return self._fault_replies()
        if status.startswith("354"):
            assert self.envelope is not None
            self._data_open = True
            self._data_rcpts = list(self.envelope.rcpt_tos)
            return status
        if self._in_lhlo or status.startswith("220"):
            return status
        return _with_enhanced(status)


class LmtpListenError(MasdError):
    """The LMTP listener cannot start (address in use, a non-socket at the path)."""

    code = "lmtp-listen"


async def start_lmtp(
    listen: Listen,
    handler: LmtpHandler,
    *,
    hostname: str,
    max_message_bytes: int,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Bind and start serving; a unix socket gets mode 0660 before it accepts anyone.

    ``sock``, an already listening socket (socket activation), is served
    instead of binding ``listen``; its owner and mode are the socket unit's.
    """
    loop = asyncio.get_running_loop()

    def factory() -> _LmtpProtocol:
        return _LmtpProtocol(
            handler,
            data_size_limit=max_message_bytes,
            enable_SMTPUTF8=True,
            hostname=hostname,  # else a DNS lookup (getfqdn) per connection
            ident="masd",
            timeout=IDLE_TIMEOUT,
            loop=loop,
        )

    if sock is not None:
        if sock.family == socket.AF_UNIX:
            return await loop.create_unix_server(factory, sock=sock)
        return await loop.create_server(factory, sock=sock)
    try:
        if isinstance(listen, UnixListen):
            sock = await _unix_socket(str(listen.path))
            try:
                return await loop.create_unix_server(factory, sock=sock)
            except BaseException:
                sock.close()
                raise
        assert isinstance(listen, TcpListen)
        return await loop.create_server(factory, host=listen.host, port=listen.port)
    except OSError as exc:
        raise LmtpListenError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc


async def _unix_socket(path: str) -> socket.socket:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise LmtpListenError(f"cannot listen on unix:{path}: it exists and is not a socket")
        if await _answers(path):
            raise LmtpListenError(f"cannot listen on unix:{path}: another process serves it")
        os.unlink(path)  # stale, left by a process that did not clean up
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # Before listen(): nobody can connect while the mode is still the umask's.
        os.chmod(path, SOCKET_MODE)
    except BaseException:
        sock.close()
        raise
    return sock


async def _answers(path: str) -> bool:
    try:
        async with asyncio.timeout(2.0):
            _, writer = await asyncio.open_unix_connection(path)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
