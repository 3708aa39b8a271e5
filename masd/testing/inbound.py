"""Inbound mail as our MX hands it to masd: its trace on top, then the message."""

from __future__ import annotations

import email.policy
import email.utils
import secrets
from collections.abc import Mapping
from email.message import EmailMessage

from masd.testing.config import AUTHSERV_ID

__all__ = ["mx_mail", "mx_trace"]


def mx_trace(
    domain: str,
    *,
    dmarc: str | None = "pass",
    authserv_id: str = AUTHSERV_ID,
    header_from: str | None = None,
    date: str | None = None,
) -> list[tuple[str, str]]:
    """What our MX writes on top of a mail from ``domain``: Authentication-Results
    (when ``dmarc`` is given) and Received, as (name, value) pairs."""
    date = date or email.utils.formatdate(usegmt=True)
    trace: list[tuple[str, str]] = []
    if dmarc is not None:
        trace.append(
            (
                "Authentication-Results",
                f"{authserv_id}; dmarc={dmarc} header.from={header_from or domain}",
            )
        )
    trace.append(("Received", f"from mail.{domain} by {AUTHSERV_ID} with ESMTPS; {date}"))
    return trace


def mx_mail(
    sender: str,
    to: str,
    *,
    name: str | None = None,
    subject: str = "Help, please",
    body: str = "Hello.\n",
    dmarc: str | None = "pass",
    authserv_id: str = AUTHSERV_ID,
    headers: Mapping[str, str] | None = None,
    in_reply_to: str | None = None,
) -> tuple[str, bytes]:
    """A mail from ``sender`` (display name ``name``) to ``to`` with our MX's trace.

    Returns its Message-ID and its bytes.
    """
    domain = sender.rsplit("@", 1)[1]
    message_id = f"<{secrets.token_hex(8)}@{domain}>"
    msg = EmailMessage(policy=email.policy.SMTP)
    for header, value in mx_trace(domain, dmarc=dmarc, authserv_id=authserv_id):
        msg[header] = value
    msg["From"] = email.utils.formataddr((name, sender)) if name else sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id
    if in_reply_to is not None:
        msg["In-Reply-To"] = in_reply_to
        msg["References"] = in_reply_to
    for header, value in (headers or {}).items():
        msg[header] = value
    msg.set_content(body)
    return message_id, msg.as_bytes()
