"""Outbound mail as RFC 5322 bytes (docs/protocol.md §5).

"From the canonical case address; To the participant; a fresh Message-ID
under the case's domain; In-Reply-To and References to the participant's
latest mail on the case (for mail.send: the message replied to);
Auto-Submitted: auto-replied on every mail email writes itself ..., none on
a master's mail.send. ... Caller-supplied subject and body never put CR, LF
or NUL into a header."
"""

from __future__ import annotations

import binascii
import email.utils
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.header import Header
from typing import Final

#: Header values never carry control characters (CR, LF, NUL, ...).
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]+")
MAX_REFERENCES: Final = 20
#: RFC 5322 §2.1.1: a line is at most 998 characters.
MAX_7BIT_LINE: Final = 998
_ADDRESS_HEADERS: Final = frozenset({"From", "To"})


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


#: The reply prefixes at the start of a subject, however many, in any case
#: (``Re:``, ``RE:``, ``re :``).  ``Fwd:`` and the like are the subject's own.
_REPLY_PREFIXES: Final = re.compile(r"^(?:re\s*:\s*)+", re.IGNORECASE)


def reply_subject(subject: str | None) -> str:
    """The subject of a reply to a mail with ``subject``: it with exactly one
    ``Re: `` in front, never ``Re: Re:`` (docs/protocol.md §8.4)."""
    subject = _REPLY_PREFIXES.sub("", clean_header(subject or ""))
    return f"Re: {subject or 'your message'}"


def message_id(token: str, domain: str) -> str:
    return f"<{token}@{domain}>"


def render(mail: OutboundMail) -> bytes:
    """The mail as CRLF bytes, ready for SMTP (and DKIM signing).

    Written out directly rather than through ``email.message.EmailMessage``:
    its header objects cost about 1.5 ms per mail, most of masd's CPU per
    delivery (docs/performance.md).  The rules it applied are kept here:
    header values folded at whitespace within 78 columns, non-ASCII header
    text as RFC 2047 encoded words, a body in 7bit when it is ASCII with
    short lines and quoted-printable otherwise (no relay needs 8BITMIME).
    """
    headers = [
        ("From", clean_header(mail.sender)),
        ("To", clean_header(mail.to)),
        ("Subject", clean_header(mail.subject)),
        ("Date", email.utils.format_datetime(datetime.fromtimestamp(mail.date, UTC))),
        ("Message-ID", clean_header(mail.message_id)),
    ]
    if mail.in_reply_to:
        headers.append(("In-Reply-To", clean_header(mail.in_reply_to)))
    refs = [clean_header(r) for r in mail.references if r][-MAX_REFERENCES:]
    if refs:
        headers.append(("References", " ".join(refs)))
    if mail.auto_submitted:
        headers.append(("Auto-Submitted", "auto-replied"))
    headers.append(("MIME-Version", "1.0"))
    headers.append(("Content-Type", 'text/plain; charset="utf-8"'))
    body = mail.body.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    if not body.endswith("\n"):
        body += "\n"
    lines = body.split("\n")[:-1]
    if body.isascii() and all(len(line) <= MAX_7BIT_LINE for line in lines):
        headers.append(("Content-Transfer-Encoding", "7bit"))
        payload = "\r\n".join(lines).encode("ascii") + b"\r\n"
    else:
        headers.append(("Content-Transfer-Encoding", "quoted-printable"))
        payload = binascii.b2a_qp(body.encode("utf-8"), istext=True).replace(b"\n", b"\r\n")
    head = "".join(_header_line(name, value) for name, value in headers)
    return head.encode("utf-8") + b"\r\n" + payload


def _header_line(name: str, value: str) -> str:
    if not value.isascii() and name not in _ADDRESS_HEADERS:
        # RFC 2047 words; address headers keep UTF-8 (RFC 6532, SMTPUTF8).
        return (
            f"{name}: " + Header(value, "utf-8", header_name=name).encode(linesep="\r\n") + "\r\n"
        )
    return _fold(f"{name}: {value}") + "\r\n"


def _fold(line: str) -> str:
    """Fold at whitespace so lines stay within 78 columns where a space allows."""
    if len(line) <= 78:
        return line
    out: list[str] = []
    current = ""
    for word in line.split(" "):
        if current and len(current) + 1 + len(word) > 78:
            out.append(current)
            current = " " + word
        else:
            current = f"{current} {word}" if current else word
    out.append(current)
    return "\r\n".join(out)
