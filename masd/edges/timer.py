"""The deadline timer: master-role handoffs that ran out of time (docs/protocol.md §12).

"Deadline = time handoff.request was recorded + the endpoint's deadline. At
the deadline with no terminal status: record timed-out ...".  Deadlines live
in the store (``handoffs.deadline_at``), so they survive a restart; this loop
sleeps until the earliest one and fires each due handoff in its own store
job.  A commit that wrote a deadline sooner than the one it sleeps until
wakes it (:meth:`DeadlineTimer.wake_for`); other commits leave it asleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from typing import Final

from masd import service
from masd.edges.context import EdgeContext
from masd.store import Tx

log = logging.getLogger("masd.timer")

#: Real seconds to rest after the store failed, and before trying a handoff
#: whose firing failed again (it stays due; this keeps the loop from spinning).
PAUSE: Final = 1.0
RETRY_FAILED_AFTER: Final = 60.0
#: Handoffs read per query when many deadlines fall due at once.
PAGE: Final = 100
#: Counter of wakes: each one costs the loop a look at the store.
WAKES_METRIC: Final = "masd_timer_wakes_total"


class DeadlineTimer:
    """Fires due deadlines; see the module docstring."""

    def __init__(self, ctx: EdgeContext) -> None:
        self._rt = ctx.rt
        self._store = ctx.store
        self._clock = ctx.clock
        self._metrics = ctx.metrics
        self._listener = ctx.listener
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing: dict[str, float] = {}  # handoff id -> clock time to try again
        # The clock time the loop sleeps until; +inf while it looks (its read
        # may predate a commit) or when no deadline is set.
        self._until = math.inf
        self._metrics.inc(WAKES_METRIC, 0.0)  # on /metrics from the start

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("DeadlineTimer already started")
        self._task = asyncio.create_task(self._run(), name="masd-timer")

    def wake(self) -> None:
        """Look again (a deadline may have been added, or the clock moved)."""
        self._metrics.inc(WAKES_METRIC)
        self._wake.set()

    def wake_for(self, deadline: float) -> None:
        """A commit wrote ``deadline``: look again only if it is sooner than the
        time the loop sleeps until (or the loop is looking now)."""
        if deadline < self._until:
            self.wake()

    @property
    def sleeps_until(self) -> float | None:
        """The clock time the loop sleeps until; None while it looks or has nothing to wait for."""
        return None if self._until == math.inf else self._until

    async def stop(self) -> None:
        """Cancel the loop; a firing in progress still commits or not at all (store jobs)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        while True:
            # Before reading: any deadline committed from now on wakes the
            # loop (it may be missing from the snapshot about to be read).
            self._until = math.inf
            self._wake.clear()
            try:
                await self._fire_due()
                until = await self._store.read(self._next)
            except Exception as exc:  # noqa: BLE001 - the store failing must not end the loop
                log.warning("deadline check failed error=%s", exc)
                await _pause(self._wake, PAUSE)
                continue
            self._until = math.inf if until is None else until
            await self._clock.wait(self._wake, until)

    async def _fire_due(self) -> None:
        """Fire every handoff due now, except those that failed a moment ago."""
        while True:
            now = self._clock.now()
            due = await self._store.read(
                functools.partial(service.due_deadlines, now=now, limit=PAGE)
            )
            todo = [h for h in due if self._failing.get(h, 0.0) <= now]
            if len(due) < PAGE:
                # A failed handoff no longer due was closed meanwhile: forget it.
                for gone in [h for h, at in self._failing.items() if at <= now and h not in due]:
                    del self._failing[gone]
            for handoff_id in todo:
                await self._fire(handoff_id, now)
            if len(due) < PAGE or not todo:
                return

    def _next(self, tx: Tx) -> float | None:
        """When to look again: the next deadline, or a failed firing's retry time."""
        deadline = service.next_deadline(tx, exclude=list(self._failing))
        times = [*self._failing.values(), *([] if deadline is None else [deadline])]
        return min(times, default=None)

    async def _fire(self, handoff_id: str, now: float) -> None:
        rt = self._rt
        try:
            fired = await self._store.write(
                lambda db: service.fire_deadline(rt, db, handoff_id, now)
            )
        except Exception as exc:  # noqa: BLE001 - one bad handoff must not stop the others
            self._failing[handoff_id] = now + RETRY_FAILED_AFTER
            log.error("deadline failed handoff=%s error=%r", handoff_id, exc)
            return
        self._failing.pop(handoff_id, None)
        if fired is not None:
            self._metrics.inc("masd_deadlines_fired_total")
            log.info("deadline fired handoff=%s status=timed-out", handoff_id)
        self._listener.committed(service.NO_WAKES if fired is None else fired)


async def _pause(event: asyncio.Event, seconds: float) -> None:
    """Rest a little real time (not clock time: a test clock may stand still)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
