"""Outbound mail: DKIM signing, then kept SMTP sessions with ``server.smtp_relay``.

docs/protocol.md §5: "DKIM-signed when the domain has a key ... Sent through
server.smtp_relay (default 127.0.0.1:25); a relay that is down is retried,
the mail is not lost."  :class:`SmtpTransport` never raises for what the
relay, the network or a key does: every outcome is an :class:`SmtpResult`
(``ok``, ``temporary``: retry later, ``permanent``: the relay refused it).

Mail goes over a small pool of persistent sessions (:mod:`masd.edges.smtp_client`,
on the event loop): several messages per session, ``MAIL``, ``RCPT`` and ``DATA``
written together where the relay offers ``PIPELINING``, ``RSET`` after a
transaction the relay refused and before reusing a session that sat idle, a new
session when the relay dropped one.  Signing (:mod:`masd.edges.dkim`) runs in
worker threads, never on the event loop's.  Measured against other clients in
docs/performance.md ("SMTP clients").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Final

from masd.clock import Clock
from masd.config import Dkim, TcpListen
from masd.edges.dkim import DkimSignError, Signer, load_signer, sign
from masd.edges.mailer import OutboundMail, SmtpResult, classify
from masd.edges.smtp_client import Reply, Session, SmtpClientError, Timeout

log = logging.getLogger("masd.smtp")

__all__ = ["DkimSignError", "SmtpResult", "SmtpTransport", "classify"]

DEFAULT_TIMEOUT: Final = 30.0
#: Sessions kept with the relay.  Each carries one transaction at a time (two round
#: trips pipelined, four without): with 4, acknowledgements queued for a free session
#: (delay p99 0.14-0.58 s at 8 LMTP sessions, unpipelined); 8, 16 and 32 gave 67-84 ms.
DEFAULT_CONNECTIONS: Final = 8
#: A session idle this long is checked with RSET before it carries mail.
PROBE_AFTER: Final = 2.0
#: A session idle this long is closed instead (relays drop idle clients: Postfix after 300 s).
IDLE_CLOSE: Final = 60.0
#: Threads that sign (OpenSSL releases the interpreter lock while it signs).
SIGNING_THREADS: Final = 2
#: What no address on a command line may hold (the client would mangle or inject it).
_UNSENDABLE: Final = re.compile(r"[\x00-\x1f\x7f<>]")


class _Dropped(Exception):
    """The relay closed a reused session before it could have taken the mail."""


class _Session:
    """One SMTP session with the relay and when it last finished a transaction."""

    def __init__(self, client: Session) -> None:
        self.client = client
        self.used = time.monotonic()

    def close(self) -> None:
        self.client.close()


class SmtpTransport:
    """The production :class:`~masd.edges.mailer.MailTransport`: ``server.smtp_relay``.

    ``keys`` maps a domain to its DKIM keys (one signature each); mail of a
    domain without keys goes unsigned.  It is read at each send, so a mapping
    that follows the running configuration signs with the keys of the moment.
    """

    def __init__(
        self,
        relay: TcpListen,
        *,
        hostname: str,
        keys: Mapping[str, Sequence[Dkim]],
        timeout: float = DEFAULT_TIMEOUT,
        connections: int = DEFAULT_CONNECTIONS,
        clock: Clock | None = None,
    ) -> None:
        self._relay, self._hostname, self._timeout = relay, hostname, timeout
        self._keys = keys
        self._signers: dict[tuple[str, tuple[Dkim, ...]], tuple[Signer, ...] | DkimSignError] = {}
        self._clock = clock or Clock()
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[_Session] = []
        self._signing: concurrent.futures.ThreadPoolExecutor | None = None

    async def send(self, mail: OutboundMail) -> SmtpResult:
        message = mail.message
        keys = tuple(self._keys.get(mail.domain, ()))
        if keys:
            if self._signing is None:
                self._signing = concurrent.futures.ThreadPoolExecutor(
                    SIGNING_THREADS, thread_name_prefix="masd-dkim"
                )
            loop = asyncio.get_running_loop()
            now = self._clock.now()
            try:
                message = await loop.run_in_executor(self._signing, self._sign, mail, keys, now)
            except DkimSignError as exc:
                # A key problem is fixed by the operator (config, restart): keep
                # the mail and retry rather than send it unsigned or drop it.
                return SmtpResult("temporary", None, exc.detail)
        async with self._slots:
            session = self._take()
            if session is not None:
                try:
                    return await self._transaction(session, mail, message, reused=True)
                except _Dropped:
                    pass  # nothing reached the relay: once more on a new session
            session_or_refusal = await self._open()
            if isinstance(session_or_refusal, SmtpResult):
                return session_or_refusal
            try:
                return await self._transaction(session_or_refusal, mail, message, reused=False)
            except _Dropped as exc:  # not raised for a new session; typed for mypy
                return self._failed(exc)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for session in idle:
            await session.client.quit(timeout=1.0)
        if self._signing is not None:
            self._signing.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ signing

    def _sign(self, mail: OutboundMail, keys: tuple[Dkim, ...], now: float) -> bytes:
        """In a signing thread: the message with one signature per key of its domain."""
        signers = self._signers.get((mail.domain, keys))
        if signers is None:
            try:
                signers = tuple(load_signer(k, mail.domain) for k in keys)
            except DkimSignError as exc:
                signers = exc
            self._signers[(mail.domain, keys)] = signers
        if isinstance(signers, DkimSignError):
            raise signers
        return sign(mail.message, signers, now)

    # ------------------------------------------------------------------ sessions

    def _take(self) -> _Session | None:
        """The most recently used live session, closing those idle too long or dropped."""
        now = time.monotonic()
        while self._idle:
            session = self._idle.pop()
            if session.client.is_connected and now - session.used < IDLE_CLOSE:
                return session
            session.close()
        return None

    async def _open(self) -> _Session | SmtpResult:
        relay = self._relay
        try:
            client, greeting = await Session.open(relay.host, relay.port, timeout=self._timeout)
        except (SmtpClientError, OSError) as exc:
            return self._failed(exc)
        try:
            reply = greeting if greeting.code != 220 else await client.hello(self._hostname)
        except (SmtpClientError, OSError) as exc:
            client.close()
            return self._failed(exc)
        if reply.code != 250:  # the greeting, or HELO, refused
            client.close()
            return classify(reply.code, _text(reply.text))
        return _Session(client)

    async def _transaction(
        self, session: _Session, mail: OutboundMail, message: bytes, *, reused: bool
    ) -> SmtpResult:
        """MAIL, RCPT, DATA on ``session``; it goes back to the pool unless it failed."""
        client = session.client
        for address in (mail.mail_from, mail.rcpt_to):
            if _UNSENDABLE.search(address):
                self._idle.append(session)
                return SmtpResult("permanent", None, f"address not sendable: {address!r}")
        utf8 = not (mail.mail_from.isascii() and mail.rcpt_to.isascii())
        if reused and time.monotonic() - session.used > PROBE_AFTER:
            await self._probe(session)
        if utf8 and not client.supports("SMTPUTF8"):
            self._idle.append(session)
            return SmtpResult("permanent", None, f"relay {self._where()} does not support SMTPUTF8")
        sent = False  # the message itself was written: the relay may have it
        try:
            commands = _envelope(mail, utf8, eight_bit=not message.isascii(), client=client)
            refusal = await self._commands(client, commands)
            if refusal is not None:
                return await self._reset(session, classify(refusal.code, _text(refusal.text)))
            sent = True
            reply = await client.message(message)
        except (SmtpClientError, OSError) as exc:
            session.close()
            if reused and not sent and not isinstance(exc, Timeout):
                raise _Dropped(str(exc)) from exc  # the relay never had the message
            return self._failed(exc)
        except ValueError as exc:  # an address that cannot go on a command line
            unsendable = SmtpResult("permanent", None, f"address not sendable: {exc}")
            return await self._reset(session, unsendable)
        except asyncio.CancelledError:
            # Broken off (an erase, a stop): the connection goes, so a relay that does not
            # have the end of the data yet never delivers the mail.
            session.close()
            raise
        result = classify(reply.code, _text(reply.text))
        if not result.ok:
            return await self._reset(session, result)
        session.used = time.monotonic()
        self._idle.append(session)
        return result

    async def _probe(self, session: _Session) -> None:
        """RSET on a session idle a while: one the relay dropped raises :class:`_Dropped`."""
        if not await self._rset(session):
            raise _Dropped("the relay did not take RSET on a session kept idle")

    @staticmethod
    async def _rset(session: _Session) -> bool:
        """RSET on ``session``: True if the relay took it, else False with the session closed."""
        if session.client.is_connected:
            try:
                if (await session.client.command(b"RSET")).code == 250:
                    return True
            except (SmtpClientError, OSError):
                pass
        session.close()
        return False

    @staticmethod
    async def _commands(client: Session, commands: list[bytes]) -> Reply | None:
        """MAIL, RCPT and DATA, pipelined where the relay offers it; the first refusal.

        Pipelined, the relay answers each of the three: a refused MAIL or RCPT makes it
        refuse DATA too (RFC 2920 §3.1), and the first refusal is the transaction's.  A
        relay that answers ``354`` all the same gets no message: the session is closed,
        so the transaction is abandoned."""
        wanted = ((250,), (250, 251), (354,))
        if client.supports("PIPELINING"):
            replies = await client.commands(commands)
        else:
            replies = []
            for command, codes in zip(commands, wanted, strict=True):
                replies.append(await client.command(command))
                if replies[-1].code not in codes:
                    break
        for reply, codes in zip(replies, wanted, strict=False):
            if reply.code not in codes:
                if replies[-1].code == 354:
                    client.close()
                return reply
        return None

    async def _reset(self, session: _Session, result: SmtpResult) -> SmtpResult:
        """After a refused transaction: RSET and keep the session (421: the relay closes it)."""
        if result.code == 421:
            session.close()
        elif await self._rset(session):
            session.used = time.monotonic()
            self._idle.append(session)
        return result

    def _failed(self, exc: BaseException) -> SmtpResult:
        if isinstance(exc, OSError) and exc.errno:
            what = os.strerror(exc.errno)  # "Connection refused", "No route to host"
        else:
            what = str(exc) or type(exc).__name__
        return SmtpResult("temporary", None, f"relay {self._where()}: {what}")

    def _where(self) -> str:
        host, port = self._relay.host, self._relay.port
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _text(reply: str) -> str:
    return " ".join(reply.split())[:500]


def _envelope(mail: OutboundMail, utf8: bool, *, eight_bit: bool, client: Session) -> list[bytes]:
    """The transaction's ``MAIL``, ``RCPT`` and ``DATA`` lines (the addresses checked)."""
    encoding = "utf-8" if utf8 else "ascii"
    options = [b" SMTPUTF8"] if utf8 else []
    if eight_bit and client.supports("8BITMIME"):
        options.append(b" BODY=8BITMIME")
    sender = b"MAIL FROM:<" + mail.mail_from.encode(encoding) + b">" + b"".join(options)
    return [sender, b"RCPT TO:<" + mail.rcpt_to.encode(encoding) + b">", b"DATA"]
