"""LMTP replies masd makes itself (docs/protocol.md §3), shared by the LMTP and policy edges.

Each kind of reply is a :class:`ReplyCode` (code, RFC 3463 enhanced code,
metrics outcome); its text is one printable ASCII line of bounded length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from masd.core.errors import AddressError

#: Longest detail text put in a reply line (RFC 5321 §4.5.3.1.5: 512 octets a line).
MAX_DETAIL: Final = 400


@dataclass(frozen=True)
class ReplyCode:
    """One kind of LMTP reply: code, RFC 3463 enhanced code, metrics outcome."""

    code: int
    enhanced: str
    outcome: str

    def line(self, text: str) -> str:
        return f"{self.code} {self.enhanced} {printable(text)}"


class Replies:
    """Every reply masd makes itself (docs/protocol.md §3 for recipients)."""

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
    FAULT: Final = ReplyCode(451, "4.3.0", "fault")
    BUSY: Final = ReplyCode(451, "4.3.2", "busy")
    TOO_MANY_SESSIONS: Final = ReplyCode(421, "4.3.2", "too-many-sessions")


def address_refusal(exc: AddressError) -> ReplyCode:
    """The reply to a recipient address masd refuses (docs/protocol.md §3)."""
    return Replies.UNKNOWN_DOMAIN if exc.code == "unknown-domain" else Replies.BAD_ADDRESS


def size_refusal(size: int, limit: int) -> str | None:
    """The refusal's text for a message of ``size`` octets over ``limit``
    (``server.max_message_bytes``; answered :data:`Replies.TOO_BIG`), or None."""
    return f"message over {limit} octets (server.max_message_bytes)" if size > limit else None


_PRINTABLE: Final = re.compile(r"[ -~]*")


def printable(text: str) -> str:
    """One ASCII line: replies never carry line breaks, controls or raw UTF-8."""
    if len(text) <= MAX_DETAIL and _PRINTABLE.fullmatch(text):
        return text  # the usual case, left as it is
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(ch if " " <= ch <= "~" else " " for ch in text)
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


class RecipientReplies(str):
    """The reply to DATA: one line per accepted recipient, joined with CRLF."""

    __slots__ = ()
