"""The deadline timer (docs/protocol.md §12) on a real store, with the test clock and the real
one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from support.outbox import Env, deliver, inbound, make_env, query

from masd.clock import TestClock
from masd.edges.context import EdgeContext
from masd.edges.outbox import Outbox
from masd.edges.timer import DeadlineTimer

REQUEST = "ticket!callback@help.example"
CASE = "ticket=gs-1@help.example"
START = 1_700_000_000.0


class Commits:
    """A commit listener that a test can wait on."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def committed(self, wakes: Any) -> None:
        self.count += 1
        self._event.set()

    async def wait(self, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self._event.wait()
        self._event.clear()


async def check_timed_out(env: Env) -> str:
    """The effects of docs/protocol.md §12 on case gs-1; returns the handoff id."""
    [h] = await query(env, "SELECT handoff_id, status, closed_at FROM handoffs")
    assert h["status"] == "timed-out"
    assert h["closed_at"] is not None
    hid = h["handoff_id"]
    statuses = await query(
        env, "SELECT status, source FROM statuses WHERE handoff_id = ? ORDER BY n", (hid,)
    )
    assert statuses == [
        {"status": "requested", "source": "email"},
        {"status": "timed-out", "source": "email"},
    ]
    rows = await query(env, "SELECT kind, state, payload FROM outbox ORDER BY id")
    contracts = [(json.loads(r["payload"]), r["state"]) for r in rows if r["kind"] == "contract"]
    assert [(m["type"], state) for m, state in contracts] == [
        ("handoff.request", "abandoned"),
        ("handoff.cancel", "pending"),
    ]
    cancel = contracts[1][0]
    assert cancel["reason"] == "timed-out"
    assert cancel["handoff_id"] == hid
    assert cancel["case"] == {"address": CASE, "key": CASE}
    mails = [json.loads(r["payload"]) for r in rows if r["kind"] == "mail"]
    assert len(mails) == 2  # the acknowledgement, then the resume notice
    assert "did not happen in time" in mails[1]["message"]
    failed = await query(
        env, "SELECT data FROM thread WHERE case_key = ? AND kind = 'delivery.failed'", (CASE,)
    )
    [df] = [json.loads(f["data"]) for f in failed]
    assert df["type"] == "handoff.request"
    assert "abandoned" in df["detail"]
    return str(hid)


def test_advancing_past_the_deadline_times_the_handoff_out(tmp_path: Path) -> None:
    async def main() -> None:
        clock = TestClock(START)
        env = await make_env(tmp_path, clock=clock, deadline="1h")
        commits = Commits()
        timer = DeadlineTimer(EdgeContext(env.rt, env.store, clock, env.metrics, commits))
        try:
            timer.start()  # nothing to wait for yet: the timer sleeps without a limit
            await deliver(env, REQUEST, inbound(REQUEST)[0])
            timer.wake()  # as the app does after a commit that may add a deadline
            [h] = await query(env, "SELECT deadline_at FROM handoffs")
            assert h["deadline_at"] == START + 3600
            clock.advance(3601)
            await commits.wait()
            await timer.stop()
            hid = await check_timed_out(env)
            assert env.metrics.value("masd_deadlines_fired_total") == 1

            # The outbox then sends the cancel, never the abandoned request.
            outbox = Outbox(EdgeContext(env.rt, env.store, clock, env.metrics))
            outbox.start()
            [cancel] = await env.peer.wait_for(1)
            await env.sink.wait_for(2)
            await outbox.stop()
            assert isinstance(cancel.json, dict)
            assert cancel.json["type"] == "handoff.cancel"
            assert cancel.json["id"] == f"cancel-{hid}"
            assert len(env.peer.requests) == 1
        finally:
            await timer.stop()
            await env.close()

    asyncio.run(main())


def test_a_deadline_that_passed_while_stopped_fires_on_start(tmp_path: Path) -> None:
    async def main() -> None:
        clock = TestClock(START)
        env = await make_env(tmp_path, clock=clock, deadline="30m")
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        env = env.reopen()  # a restart: the deadline lives in the store
        clock.advance(7200)
        commits = Commits()
        timer = DeadlineTimer(EdgeContext(env.rt, env.store, clock, env.metrics, commits))
        try:
            timer.start()
            await commits.wait()
            await timer.stop()
            await check_timed_out(env)
        finally:
            await timer.stop()
            await env.close()

    asyncio.run(main())


def test_a_handoff_that_ended_in_time_is_left_alone(tmp_path: Path) -> None:
    async def main() -> None:
        clock = TestClock(START)
        env = await make_env(tmp_path, clock=clock, deadline="1h")
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        await deliver(env, "ticket!callback@help.example", inbound(REQUEST)[0])  # gs-2

        def complete_first(db: Any) -> None:
            db.execute(
                "UPDATE handoffs SET status = 'completed', closed_at = ? "
                "WHERE case_key = 'ticket=gs-1@help.example'",
                (clock.now(),),
            )

        await env.store.write(complete_first)
        commits = Commits()
        timer = DeadlineTimer(EdgeContext(env.rt, env.store, clock, env.metrics, commits))
        try:
            timer.start()
            clock.advance(3601)
            await commits.wait()
            await timer.stop()
            rows = await query(env, "SELECT case_key, status FROM handoffs ORDER BY case_key")
            assert rows == [
                {"case_key": "ticket=gs-1@help.example", "status": "completed"},
                {"case_key": "ticket=gs-2@help.example", "status": "timed-out"},
            ]
            assert commits.count == 1
        finally:
            await timer.stop()
            await env.close()

    asyncio.run(main())


def test_the_real_clock_fires_too(tmp_path: Path) -> None:
    async def main() -> None:
        env = await make_env(tmp_path, deadline="1s")
        commits = Commits()
        timer = DeadlineTimer(EdgeContext(env.rt, env.store, env.clock, env.metrics, commits))
        try:
            await deliver(env, REQUEST, inbound(REQUEST)[0])
            timer.start()
            await commits.wait()
            await timer.stop()
            await check_timed_out(env)
        finally:
            await timer.stop()
            await env.close()

    asyncio.run(main())
