"""The LMTP listener: Postfix hands mail to masd here (docs/protocol.md §3).

Recipients are checked at RCPT so Postfix can refuse at SMTP time; the mail
is recorded per recipient at DATA, each in its own store job, concurrently.
The session itself (aiosmtpd's LMTP, with masd's fixes) is
:mod:`masd.edges.lmtp_session`; the replies are :mod:`masd.edges.lmtp_replies`; the
recipient decision, shared with the policy and milter listeners and ``masd explain``,
is :mod:`masd.edges.lmtp_recipient`.

At most ``server.max_lmtp_sessions`` sessions are open at once: one more is
answered ``421 4.3.2`` when it connects and closed (:mod:`masd.edges.limits`).
A session that makes no progress for :data:`IDLE_TIMEOUT` seconds is closed;
nothing of its unfinished transaction is recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Final

from aiosmtpd.smtp import SMTP, Envelope, Session

from masd import service
from masd.config import Listen
from masd.core.address import Address, parse_address
from masd.core.bounce import split_bounce
from masd.core.errors import AddressError, MasdError
from masd.core.event import ParsedMail, build_event
from masd.edges.accept import AcceptServer
from masd.edges.bounce_reader import BounceReader, Busy
from masd.edges.context import EdgeContext
from masd.edges.limits import Gate
from masd.edges.lmtp_data import read_data
from masd.edges.lmtp_recipient import _undecodable, check_address, check_recipient
from masd.edges.lmtp_replies import (
    MAX_DETAIL,
    RecipientReplies,
    Replies,
    ReplyCode,
    address_refusal,
)
from masd.edges.lmtp_session import LmtpProtocol, plain_path
from masd.edges.sockets import SOCKET_MODE, ListenError, serve
from masd.logs import shown
from masd.service import UnknownCase, bounce_mail
from masd.service.trust_watch import TrustWatch
from masd.store import StoreError

__all__ = [
    "IDLE_TIMEOUT",
    "MAX_DETAIL",
    "MAX_SESSIONS",
    "SOCKET_MODE",
    "LmtpHandler",
    "LmtpListenError",
    "LmtpProtocol",
    "RecipientReplies",
    "Replies",
    "ReplyCode",
    "check_address",
    "check_recipient",
    "new_message_ref",
    "plain_path",
    "read_data",
    "received_at",
    "start_lmtp",
]

log = logging.getLogger("masd.lmtp")

#: docs/protocol.md §3: a session with no command and no data for this long is closed
#: (RFC 5321 §4.5.3.2: 5 minutes).  The time masd takes to record the data
#: does not count.
IDLE_TIMEOUT: Final = 300.0
#: docs/protocol.md §3: ``server.max_lmtp_sessions`` by default.
MAX_SESSIONS: Final = 100
#: Messages at least this large are parsed on a worker thread, not on the loop.
THREAD_PARSE_BYTES: Final = 256 * 1024
METRIC: Final = "masd_deliveries_total"
REFUSED_METRIC: Final = "masd_connections_refused_total"


#: The second :func:`received_at` last formatted, and its text (replaced whole, so a
#: parse on a worker thread reads one consistent pair).
_second: tuple[int, str] = (-1, "")


def received_at(now: float) -> str:
    """RFC 3339 UTC timestamp, millisecond precision (what ``datetime`` writes: the
    time rounded half-even to the microsecond, then cut to the millisecond); the
    date and time of each second are formatted once."""
    global _second
    second = math.floor(now)
    micros = round((now - second) * 1_000_000)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{cached[1]}.{micros // 1000:03d}Z"


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
        # Read per input, so a reload applies to the next message; the size
        # limit is the listener's (a change to it needs a restart).
        self.size_limit = server.max_message_bytes
        self._inflight: set[asyncio.Task[str]] = set()
        self.trust_watch = TrustWatch(ctx.metrics, server.trusted_authserv_ids)
        self.bounces = BounceReader(ctx.metrics)

    # -- aiosmtpd hooks -------------------------------------------------------

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        # LHLO goes through aiosmtpd's EHLO.
        return ehlo_offering(session, hostname, responses, ("PIPELINING", "ENHANCEDSTATUSCODES"))

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
        config = self.rt.config
        delimiter = config.server.recipient_delimiter
        split = split_bounce(rcpt, delimiter)
        return parse_address(
            split.address if split else rcpt, delimiter=delimiter, domains=config.domains
        )

    async def check_recipient(self, rcpt: str) -> tuple[ReplyCode, str]:
        """docs/protocol.md §3 at RCPT: would a mail to ``rcpt`` be recorded?"""
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
        elif getattr(self.store, "concurrent_writes", False):
            # Write jobs run side by side (PostgreSQL): one after another, so that the
            # recipients of one mail open their cases in the order they were given.
            results = [
                await self._record_one(rcpt, parsed, raw, sha, now, i == 0)
                for i, rcpt in enumerate(rcpts)
            ]
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
        trust = self.rt.trust()

        def work() -> tuple[ParsedMail, str]:
            parsed = build_event(
                raw,
                mail_from=mail_from,
                rcpt_to=rcpt,
                received_at=received_at(now),
                message_ref=new_message_ref(now),
                trust=trust,
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
            bounce = await self._read_bounce(rcpt, mail, raw, sha, now)
            done = await self.store.write(
                lambda db: service.deliver(self.rt, db, addr, mail, raw, sha, now, bounce)
            )
        except UnknownCase as exc:
            reply, text = Replies.UNKNOWN_CASE, exc.detail
        except (Busy, bounce_mail.NotRead) as exc:
            reply, text = Replies.BUSY, exc.detail
        except AddressError as exc:
            reply, text = address_refusal(exc), exc.detail
        except StoreError as exc:  # one line: masd.store logs the cause once
            log.warning("rcpt=%s not recorded: %s", rcpt, exc)
            reply, text = Replies.FAULT, f"temporary failure ({exc.code}), try again later"
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
                "rcpt=%s key=%s message_ref=%s message_id=%s outcome=%s trust=%s",
                rcpt,
                shown(done.case_key),
                done.message_ref,
                shown(mail.event.message_id),
                reply.outcome,
                mail.cause.cause,
                extra={"case": done.case_key, "message_ref": done.message_ref},
            )
            self.metrics.inc(METRIC, outcome=reply.outcome)
            if not done.duplicate:
                self.trust_watch.observe(mail.auth.dmarc)
            return reply.line(text), done.wakes
        if reply is not Replies.FAULT:
            log.info("rcpt=%s refused at DATA reply=%s detail=%s", rcpt, reply.code, text)
        self.metrics.inc(METRIC, outcome=reply.outcome)
        return reply.line(text), None

    async def _read_bounce(
        self, rcpt: str, mail: ParsedMail, raw: bytes, sha: str, now: float
    ) -> bounce_mail.Read | None:
        """For a bounce address, the mail read as a bounce (in the bounce reader's own
        process), unless it is recorded already: a repeat costs no reading."""
        if split_bounce(rcpt, self.rt.config.server.recipient_delimiter) is None:
            return None
        if await self.store.read(lambda tx: service.already_recorded(tx, mail, sha, now)):
            return bounce_mail.Read(None, unread=bounce_mail.SKIPPED)
        return await self.bounces.read(raw)

    @property
    def in_flight(self) -> int:
        """Messages being recorded right now (their sessions may be gone)."""
        return len(self._inflight)

    async def drain(self) -> None:
        """Wait until every recording in flight has finished (for shutdown)."""
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def close(self) -> None:
        """After the last recording: end the bounce reader's process."""
        await self.bounces.close()


def ehlo_offering(
    session: Session, hostname: str, responses: list[str], wanted: Iterable[str]
) -> list[str]:
    """aiosmtpd's EHLO ``responses`` with the ``wanted`` keywords offered too (and its
    ``HELP`` left out); as an EHLO hook must, it records the client's name."""
    session.host_name = hostname
    keywords = [r[4:] for r in responses[1:] if r[4:] != "HELP"]
    for keyword in wanted:
        if keyword not in keywords:
            keywords.insert(0, keyword)
    lines = [responses[0][4:], *keywords]
    return [f"250-{x}" for x in lines[:-1]] + [f"250 {lines[-1]}"]


def new_message_ref(now: float) -> str:
    """``msg-`` and 32 hex digits: the time in milliseconds (12), then 80 random bits.

    The time comes first so that a new message's key sorts after the ones
    before it: inserts into the ``messages`` primary key land on its right
    edge, not on a random page of an index that outgrows SQLite's cache
    (docs/performance.md, "Scale").  The random part keeps keys unique.
    """
    millis = int(now * 1000) % (1 << 48)
    return f"msg-{millis:012x}{secrets.token_hex(10)}"


class LmtpListenError(ListenError):
    """The LMTP listener cannot start (address in use, a non-socket at the path)."""

    code = "lmtp-listen"


async def start_lmtp(
    listen: Listen,
    handler: LmtpHandler,
    *,
    hostname: str,
    max_message_bytes: int,
    sock: socket.socket | None = None,
    max_sessions: int = MAX_SESSIONS,
    idle_timeout: float = IDLE_TIMEOUT,
) -> AcceptServer:
    """Bind and start serving; a unix socket gets mode 0660 before it accepts anyone.

    ``sock``, an already listening socket (socket activation), is served
    instead of binding ``listen``; its owner and mode are the socket unit's.
    """
    loop = asyncio.get_running_loop()

    def session() -> LmtpProtocol:
        return LmtpProtocol(
            handler,
            data_size_limit=max_message_bytes,
            enable_SMTPUTF8=True,
            hostname=hostname,  # else a DNS lookup (getfqdn) per connection
            ident="masd",
            timeout=idle_timeout,
            loop=loop,
        )

    text = f"{hostname} {max_sessions} sessions open (server.max_lmtp_sessions), try again later"
    gate = Gate(
        session,
        name="lmtp",
        limit=max_sessions,
        refusal=(Replies.TOO_MANY_SESSIONS.line(text) + "\r\n").encode("ascii"),
        on_refused=lambda: handler.metrics.inc(REFUSED_METRIC, listener="lmtp"),
    )
    return await serve(gate, listen, sock=sock, error=LmtpListenError)
