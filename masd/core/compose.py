"""Outbound mail as RFC 5322 bytes (PROFILE §4).

"From the canonical case address; To the participant; a fresh Message-ID
under the case's domain; In-Reply-To and References to the participant's
latest mail on the case (for mail.send: the message replied to);
Auto-Submitted: auto-replied on every mail email writes itself ..., none on
a master's mail.send. ... Caller-supplied subject and body never put CR, LF
or NUL into a header."
"""

from __future__ import annotations

import email.policy
import email.utils
import re
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Final

#: Header values never carry control characters (CR, LF, NUL, ...).
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]+")
MAX_REFERENCES: Final = 20
_POLICY: Final = email.policy.SMTP.clone(max_line_length=78)


@dataclass(frozen=True)
class OutboundMail:
    sender: str  # the canonical case address
    to: str
    subject: str
    body: str
    message_id: str  # with angle brackets
    in_reply_to: str | None
    references: Sequence[str]
    auto_submitted: bool
    date: float  # epoch seconds


def clean_header(value: str, limit: int = 998) -> str:
    """A caller's text made safe for one header line."""
    return _CONTROL.sub(" ", value).strip()[:limit]


def reply_subject(subject: str | None) -> str:
    subject = clean_header(subject or "")
    if not subject:
        return "Re: your message"
    return subject if subject[:3].lower() == "re:" else f"Re: {subject}"


def message_id(token: str, domain: str) -> str:
    return f"<{token}@{domain}>"


def render(mail: OutboundMail) -> bytes:
    """The mail as CRLF bytes, ready for SMTP (and DKIM signing)."""
    msg = EmailMessage(policy=_POLICY)
    msg["From"] = mail.sender
    msg["To"] = mail.to
    msg["Subject"] = clean_header(mail.subject)
    msg["Date"] = email.utils.formatdate(mail.date, usegmt=True)
    msg["Message-ID"] = mail.message_id
    if mail.in_reply_to:
        msg["In-Reply-To"] = clean_header(mail.in_reply_to)
    refs = [clean_header(r) for r in mail.references if r][-MAX_REFERENCES:]
    if refs:
        msg["References"] = " ".join(refs)
    if mail.auto_submitted:
        msg["Auto-Submitted"] = "auto-replied"
    msg["MIME-Version"] = "1.0"
    body = mail.body.replace("\x00", "")
    # Quoted-printable for anything non-ASCII: no relay on the way needs 8BITMIME.
    msg.set_content(body, charset="utf-8", cte=None if body.isascii() else "quoted-printable")
    return msg.as_bytes(policy=_POLICY)
