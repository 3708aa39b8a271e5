"""Principle 10: whom email may mail, and how often (docs/protocol.md §4.4, §4).

docs/protocol.md §4.4: "Email MUST NOT send mail to a sender that did not pass DMARC (as
read from trusted Authentication-Results), to automated mail (Auto-Submitted
other than no, or Precedence: bulk | list | junk), or to the null sender. It
MUST NOT send once its send cap is reached. These rules hold whoever asks for
the send: email itself as master, the case's autonomous policy, or a master's
mail.send."

:func:`decide_send` is the one decision every outbound mail passes through;
the store calls it with the counts it keeps (``send_log``) right before it
queues a mail, and records a refusal in the thread instead of a send.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

#: The refusal reasons of docs/protocol.md §8 (``mail.send`` responses) and docs/protocol.md §4.
Refusal = Literal[
    "unauthenticated-sender", "automated-sender", "send-cap-reached", "unknown-message"
]

#: docs/protocol.md §4: "per_recipient_per_day (default 10, rolling 24 h ...)".
CAP_WINDOW_SECONDS: Final = 24 * 3600


@dataclass(frozen=True)
class Recipient:
    """What masd recorded of the mail whose sender would receive the send."""

    address: str
    authenticated: bool  # DMARC pass, from trusted A-R, header.from matching (docs/protocol.md §4)
    automated: bool  # Auto-Submitted / Precedence / null sender (docs/protocol.md §4)


@dataclass(frozen=True)
class Counts:
    """Mails already sent: over the case's life, and to this recipient in 24 h."""

    case_sent: int
    recipient_sent_24h: int


@dataclass(frozen=True)
class Caps:
    per_case: int = 20
    per_recipient_per_day: int = 10


def decide_send(recipient: Recipient | None, counts: Counts, caps: Caps) -> Refusal | None:
    """``None`` if the mail may go, else the reason it is refused.

    The order of the checks fixes which reason is given when several apply:
    a message that does not exist, then who the recipient is, then the caps.
    """
    if recipient is None:
        return "unknown-message"
    # The null sender is automated mail too (docs/protocol.md §4) and has no address.
    if recipient.automated or not recipient.address:
        return "automated-sender"
    if not recipient.authenticated:
        return "unauthenticated-sender"
    # "Reaching either cap refuses the send" (docs/protocol.md §4): a cap of 20 allows
    # 20 mails and refuses the 21st.
    if counts.case_sent >= caps.per_case or counts.recipient_sent_24h >= caps.per_recipient_per_day:
        return "send-cap-reached"
    return None
