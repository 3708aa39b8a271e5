"""The seam between the outbox and whatever carries mail: :class:`MailTransport`.

The outbox hands each mail to a transport as an :class:`OutboundMail` and gets
an :class:`SmtpResult` back; a transport never raises for what the relay, the
network or a key does.  Production uses :class:`masd.edges.smtp.SmtpTransport`
(``server.smtp_relay``, DKIM-signed per domain); tests use
:class:`masd.testing.mail.MemoryMailTransport`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Outcome = Literal["ok", "temporary", "permanent"]


@dataclass(frozen=True)
class OutboundMail:
    """One message for one recipient; ``domain`` picks the DKIM key."""

    mail_from: str
    rcpt_to: str
    message: bytes
    domain: str


@dataclass(frozen=True)
class SmtpResult:
    """What became of one message: the outcome, the relay's reply code and text."""

    outcome: Outcome
    code: int | None
    text: str

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def describe(self) -> str:
        """One line for logs and ``last_error``: ``SMTP 550 5.1.1 no such user``."""
        return f"SMTP {self.code} {self.text}" if self.code is not None else self.text


def classify(code: int, text: str) -> SmtpResult:
    """An SMTP reply as an outcome: 2xx ok, 5xx permanent, anything else temporary."""
    if 200 <= code < 300:
        return SmtpResult("ok", code, text)
    if 500 <= code < 600:
        return SmtpResult("permanent", code, text)
    return SmtpResult("temporary", code, text)


class MailTransport(Protocol):
    """Carries mail to the relay. ``send`` never raises for a delivery problem."""

    async def send(self, mail: OutboundMail) -> SmtpResult:
        """Sign (when the domain has a key) and deliver ``mail``; say what became of it."""
        ...

    async def close(self) -> None:
        """Release connections and threads; called once, at stop."""
        ...
