"""Time, injected: the real clock, or a test clock that conformance flows tick.

Every part of masd reads time from one :class:`Clock`; nothing calls
``time.time()`` directly, so a flow can advance time past a deadline without
waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class Clock:
    """Wall-clock time (epoch seconds) and a way to wait for it."""

    def now(self) -> float:
        return time.time()

    async def wait(self, event: asyncio.Event, until: float | None) -> None:
        """Wait until ``event`` is set or the clock reaches ``until`` (None: no limit)."""
        timeout = None if until is None else max(0.0, until - self.now())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


class TestClock(Clock):
    """A clock that moves only when told (``advance``); waiters wake when it does.

    masd enables it only with an explicit option and only on loopback
    listeners: it lets a caller move masd's deadlines.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._moved = asyncio.Event()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        self._now += seconds
        self._moved.set()
        self._moved = asyncio.Event()
        return self._now

    async def wait(self, event: asyncio.Event, until: float | None) -> None:
        while not event.is_set() and (until is None or self._now < until):
            moved = asyncio.ensure_future(self._moved.wait())
            woke = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait({moved, woke}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
                woke.cancel()
