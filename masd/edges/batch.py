"""Calls that end close together, served by one write.

:class:`Batch` gathers the items handed to :meth:`Batch.add` and writes
them with one call of its ``write`` function: while a write is under way the
next items wait, and the next write takes all of them.  So at most one write
is in flight, the first item is written at once, and under load each write
carries what came in during the one before.  Every caller of :meth:`add` is
answered when the write holding its item has ended: with ``None``, or with
that write's exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batch(Generic[T]):
    """One write for the items that arrive together; see the module docstring."""

    def __init__(self, write: Callable[[list[T]], Awaitable[None]]) -> None:
        self._write = write
        self._waiting: list[tuple[T, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    async def add(self, item: T) -> None:
        """Write ``item`` with the next write; raises what that write raised."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name="masd-batch")
        await future

    async def close(self) -> None:
        """Wait for the writes under way (a caller that stopped waiting leaves one behind)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _drain(self) -> None:
        try:
            while self._waiting:
                taken, self._waiting = self._waiting, []
                try:
                    await self._write([item for item, _ in taken])
                except asyncio.CancelledError:
                    for _, future in taken:
                        future.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - handed to every caller of the write
                    _answer(taken, exc)
                else:
                    _answer(taken, None)
        finally:
            self._task = None


def _answer(taken: list[tuple[T, asyncio.Future[None]]], exc: Exception | None) -> None:
    for _, future in taken:
        if future.done():  # its caller was cancelled
            continue
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
