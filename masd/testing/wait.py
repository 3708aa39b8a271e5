"""Bounded waits for what a process does on its own: poll a condition until it holds."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

__all__ = ["POLL", "WAIT", "poll", "wait_until"]

#: The default bound of a wait (seconds), and how often a condition is looked at.
WAIT = 15.0
POLL = 0.05

Check = Callable[[], bool | Awaitable[bool]]


async def poll(
    check: Check,
    *,
    within: float,
    every: float = POLL,
    pause: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """Call ``check`` (sync or async) until it returns true; False once ``within``
    seconds have passed.  It is called at least once, and once more after the
    bound, so a slow check still gets its last look.  ``pause`` replaces the
    sleep of ``every`` seconds between two looks."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if loop.time() > until:
            return False
        if pause is None:
            await asyncio.sleep(every)
        else:
            await pause()


async def wait_until(test: Check, what: str, timeout: float = WAIT) -> None:
    """Poll ``test`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    if not await poll(test, within=timeout):
        raise AssertionError(f"{what}: not within {timeout:g} s")
