"""An in-memory :class:`~masd.edges.mailer.MailTransport` for unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from masd.edges.mailer import OutboundMail, SmtpResult

#: What the fake answers by default: the relay took the mail.
ACCEPTED = SmtpResult("ok", 250, "2.0.0 queued")


class MemoryMailTransport:
    """Keeps every mail it is given; answers with ``answer(mail)`` (default: accepted)."""

    def __init__(self, answer: Callable[[OutboundMail], SmtpResult] | None = None) -> None:
        self.sent: list[OutboundMail] = []
        self.closed = False
        self._answer = answer or (lambda _mail: ACCEPTED)
        self._arrived = asyncio.Event()

    async def send(self, mail: OutboundMail) -> SmtpResult:
        result = self._answer(mail)
        if result.ok:
            self.sent.append(mail)
            self._arrived.set()
        return result

    async def close(self) -> None:
        self.closed = True

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[OutboundMail]:
        """The first ``count`` mails accepted, waiting up to ``timeout`` s for them."""
        async with asyncio.timeout(timeout):
            while len(self.sent) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.sent[:count]
