"""The demo's output, in the same order on every run.

masd answers on several queues at once (a mail to the relay and a request
to a mode endpoint leave side by side), so the order in which the demo's
fakes hear of things varies from run to run.  The stage fixes the printed
order:

- what the demo does to masd (an LMTP delivery, a peer's POST) is an *act*:
  one at a time, and its own line is printed when masd has answered;
- what a fake receives meanwhile is an *effect* of that act: held, and
  printed after the act's lines once masd has nothing left to send
  (:attr:`Stage.idle`), ordered by who received it (:data:`RECEIVERS`) and,
  for one receiver, as it arrived (masd sends one case's messages to one
  peer in order).

So an effect is never printed before the line of the act that caused it,
and the set of effects of an act does not depend on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TextIO

from masd.testing.wait import poll

__all__ = ["RECEIVERS", "Stage"]

#: The order in which held effects are printed, by who received them.
RECEIVERS: Final = ("crm", "callback", "mail out")
#: How long an act waits for masd to have nothing left to send.
SETTLE_SECONDS: Final = 20.0


class Stage:
    """Prints headings, explanations and events, and runs the demo's acts one at a time."""

    def __init__(self, out: TextIO, *, settle_seconds: float = SETTLE_SECONDS) -> None:
        self.out = out
        self.settle_seconds = settle_seconds
        #: True when masd has nothing left to send (set once masd runs).
        self.idle: Callable[[], Awaitable[bool]] | None = None
        self._lock = asyncio.Lock()
        self._acting = False
        self._held: list[tuple[int, int, list[str]]] = []

    # ---- lines printed at once: the story's and an act's own

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def heading(self, text: str) -> None:
        self.line()
        self.line(text)
        self.line("-" * len(text))

    def event(self, who: str, text: str) -> None:
        self.line(_event(who, text))

    # ---- effects: held while an act is on

    def effect(self, who: str, text: str, *more: str) -> None:
        """What ``who`` received: one event line and its continuation lines."""
        lines = [_event(who, text), *(_event("", m) for m in more)]
        if not self._acting:
            for line in lines:
                self.line(line)
            return
        rank = RECEIVERS.index(who) if who in RECEIVERS else len(RECEIVERS)
        self._held.append((rank, len(self._held), lines))

    @asynccontextmanager
    async def act(self) -> AsyncIterator[None]:
        """One act at a time; on leaving, wait until masd is idle, then print its effects."""
        async with self._lock:
            self._acting = True
            try:
                yield
                if self.idle is not None:
                    await poll(self.idle, within=self.settle_seconds)
            finally:
                self._acting = False
                self._flush()

    def _flush(self) -> None:
        held, self._held = sorted(self._held), []
        for _rank, _n, lines in held:
            for line in lines:
                self.line(line)


def _event(who: str, text: str) -> str:
    return f"  {who:<9} | {text}"
