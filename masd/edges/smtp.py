"""Outbound mail: DKIM signing and one SMTP transaction with ``server.smtp_relay``.

docs/protocol.md §5: "DKIM-signed when the domain has a key ... Sent through
server.smtp_relay (default 127.0.0.1:25); a relay that is down is retried,
the mail is not lost."  :func:`send_mail` never raises for what the relay,
the network or the key does: every outcome is an :class:`SmtpResult`
(``ok``, ``temporary``: retry later, ``permanent``: the relay refused it).
smtplib blocks, so the whole transaction (signing included: RSA is CPU
work) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import re
import smtplib
from collections.abc import Mapping
from typing import Final

import dkim as dkimpy

from masd.config import Dkim, TcpListen
from masd.core.errors import MasdError
from masd.edges.mailer import OutboundMail, SmtpResult, classify

log = logging.getLogger("masd.smtp")

__all__ = ["DkimSignError", "SmtpResult", "SmtpTransport", "classify", "dkim_sign", "send_mail"]

#: Headers the DKIM signature covers, when the message has them.
SIGNED_HEADERS: Final = (
    "From",
    "To",
    "Subject",
    "Date",
    "Message-ID",
    "In-Reply-To",
    "References",
    "Auto-Submitted",
    "MIME-Version",
    "Content-Type",
)
DEFAULT_TIMEOUT: Final = 30.0

_HEADER_NAME = re.compile(rb"^([!-9;-~]+)[ \t]*:", re.MULTILINE)


class DkimSignError(MasdError):
    """The message could not be DKIM-signed (bad key or message)."""

    code = "dkim-failed"


def dkim_sign(message: bytes, key: Dkim, domain: str) -> bytes:
    """``message`` with a ``DKIM-Signature`` header on top (relaxed/relaxed).

    Signs the :data:`SIGNED_HEADERS` that the message carries.
    """
    head = message.split(b"\r\n\r\n", 1)[0]
    present = {m.group(1).decode("ascii").lower() for m in _HEADER_NAME.finditer(head)}
    include = [h.encode("ascii") for h in SIGNED_HEADERS if h.lower() in present]
    try:
        signature = dkimpy.sign(
            message,
            key.selector.encode("ascii"),
            domain.encode("ascii"),
            key.key,
            canonicalize=(b"relaxed", b"relaxed"),
            include_headers=include,
        )
    except (dkimpy.DKIMException, UnicodeError, ValueError) as exc:
        raise DkimSignError(f"DKIM signing for {domain} (selector {key.selector}): {exc}") from exc
    return bytes(signature) + message


async def send_mail(
    relay: TcpListen,
    mail_from: str,
    rcpt_to: str,
    message: bytes,
    *,
    dkim: Dkim | None,
    domain: str,
    hostname: str,
    timeout: float = DEFAULT_TIMEOUT,
) -> SmtpResult:
    """Sign (when ``dkim``) and send one message to one recipient through ``relay``."""
    return await asyncio.to_thread(
        _send, relay, mail_from, rcpt_to, message, dkim, domain, hostname, timeout
    )


def _send(
    relay: TcpListen,
    mail_from: str,
    rcpt_to: str,
    message: bytes,
    key: Dkim | None,
    domain: str,
    hostname: str,
    timeout: float,
) -> SmtpResult:
    if key is not None:
        try:
            message = dkim_sign(message, key, domain)
        except DkimSignError as exc:
            # A key problem is fixed by the operator (config, restart): keep
            # the mail and retry rather than send it unsigned or drop it.
            return SmtpResult("temporary", None, exc.detail)
    try:
        return _transaction(relay, mail_from, rcpt_to, message, hostname, timeout)
    except smtplib.SMTPNotSupportedError as exc:
        return SmtpResult("permanent", None, f"relay {_where(relay)}: {exc}")
    except smtplib.SMTPResponseException as exc:
        return classify(exc.smtp_code, _text(exc.smtp_error))
    except smtplib.SMTPException as exc:  # disconnected, and the like
        return SmtpResult("temporary", None, f"relay {_where(relay)}: {exc or type(exc).__name__}")
    except UnicodeError as exc:
        return SmtpResult("permanent", None, f"address not sendable: {exc}")
    except OSError as exc:  # refused, reset, timed out, no route
        return SmtpResult("temporary", None, f"relay {_where(relay)}: {exc or type(exc).__name__}")


def _transaction(
    relay: TcpListen, mail_from: str, rcpt_to: str, message: bytes, hostname: str, timeout: float
) -> SmtpResult:
    smtp = smtplib.SMTP(local_hostname=hostname, timeout=timeout)
    try:
        code, reply = smtp.connect(relay.host, relay.port)
        if code != 220:
            return classify(code, _text(reply))
        code, reply = smtp.ehlo(hostname)
        if code != 250:
            code, reply = smtp.helo(hostname)
            if code != 250:
                return classify(code, _text(reply))
        options: list[str] = []
        if not (mail_from.isascii() and rcpt_to.isascii()):
            options.append("SMTPUTF8")  # smtplib refuses it when the relay lacks it
        if not message.isascii() and smtp.has_extn("8bitmime"):
            options.append("BODY=8BITMIME")
        code, reply = smtp.mail(mail_from, options)
        if code != 250:
            return classify(code, _text(reply))
        code, reply = smtp.rcpt(rcpt_to)
        if code not in (250, 251):
            return classify(code, _text(reply))
        code, reply = smtp.data(message)
        return classify(code, _text(reply))
    finally:
        _quit(smtp)


def _quit(smtp: smtplib.SMTP) -> None:
    # The answer to DATA stands whatever QUIT does.
    try:
        smtp.quit()
    except (smtplib.SMTPException, OSError):
        smtp.close()


def _text(reply: bytes | str) -> str:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    return " ".join(text.split())[:500]


def _where(relay: TcpListen) -> str:
    return f"[{relay.host}]:{relay.port}" if ":" in relay.host else f"{relay.host}:{relay.port}"


class SmtpTransport:
    """The production :class:`~masd.edges.mailer.MailTransport`: ``server.smtp_relay``.

    ``keys`` maps a domain to its DKIM key; mail of a domain without one goes unsigned.
    """

    def __init__(
        self,
        relay: TcpListen,
        *,
        hostname: str,
        keys: Mapping[str, Dkim],
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._relay, self._hostname, self._keys = relay, hostname, dict(keys)
        self._timeout = timeout

    async def send(self, mail: OutboundMail) -> SmtpResult:
        return await send_mail(
            self._relay,
            mail.mail_from,
            mail.rcpt_to,
            mail.message,
            dkim=self._keys.get(mail.domain),
            domain=mail.domain,
            hostname=self._hostname,
            timeout=self._timeout,
        )

    async def close(self) -> None:
        return None
