"""Rows handed to the outbox with the wake (masd/edges/outbox_heads.py): a commit's queue
heads are sent without reading them back; a row behind another is not handed and waits."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from support.outbox import Env, deliver, eventually, inbound, query, run_env

from masd.clock import TestClock
from masd.edges.context import EdgeContext
from masd.edges.outbox import Outbox
from masd.edges.outbox_heads import look
from masd.service import Wakes
from masd.store import outbox as rows
from masd.testing import MemoryMailTransport

T = TypeVar("T")
START = 1_800_000_000.0
INTAKE = "ticket@help.example"


def count_looks(env: Env) -> list[int]:
    """Counts the outbox's reads of due rows (a look) on ``env.store``, in a list of one."""
    looks = [0]
    read = env.store.read

    async def counted(fn: Callable[[Any], T]) -> T:
        if isinstance(fn, functools.partial) and fn.func is look:
            looks[0] += 1
        return await read(fn)

    env.store.read = counted  # type: ignore[method-assign]
    return looks


async def settled(outbox: Outbox) -> None:
    """Until the outbox has no send under way and its loop waits."""
    await eventually(lambda: not outbox._in_flight, "no send under way")
    for _ in range(20):
        await asyncio.sleep(0)


def test_handed_rows_go_out_without_a_look_and_pending_ones_at_start(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        looks = count_looks(env)
        # Left pending from before a (re)start: found by the first look.
        await deliver(env, INTAKE, inbound(INTAKE)[0])
        transport = MemoryMailTransport()
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), mail=transport)
        outbox.start()
        try:
            await transport.wait_for(1)
            await settled(outbox)
            assert looks[0] >= 1
            before = looks[0]
            for n in (2, 3, 4):
                got = await deliver(env, INTAKE, inbound(INTAKE)[0])
                assert len(got.wakes.rows) == 1  # the acknowledgement, its queue's head
                outbox.wake(got.wakes.queues, got.wakes.rows)  # as the app's Wakeup does
                await transport.wait_for(n)
                await settled(outbox)
            assert looks[0] == before  # no read of due rows, nor of the next head
        finally:
            await outbox.stop()
        states = await query(env, "SELECT state FROM outbox ORDER BY id")
        assert [r["state"] for r in states] == ["done"] * 4
        assert len(transport.sent) == 4  # each once

    run_env(tmp_path, body, clock=TestClock(START))


def test_a_row_behind_a_pending_head_is_not_handed_and_waits_for_it(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        row = rows.NewRow("mail", "q|smtp", "smtp", None, None, {"x": 1})

        def queue_two(db: Any) -> list[tuple[rows.OutboxItem, bool]]:
            return [rows.queue_item(db, row, START, START + 60) for _ in range(2)]

        (first, head1), (_second, head2) = await env.store.write(queue_two)
        assert (head1, head2) == (True, False)
        assert first.payload == (await query(env, "SELECT payload FROM outbox"))[0]["payload"]

        def send_first(db: Any) -> tuple[tuple[bool, bool], rows.OutboxItem, bool]:
            relayed = rows.relayed(db, first.id, START)()  # another row of its queue waits
            third, head3 = rows.queue_item(db, row, START, START + 60)
            return relayed, third, head3

        relayed, _, head3 = await env.store.write(send_first)
        assert relayed == (True, True)
        assert head3 is False  # the second is its queue's head now

        # A job with a row that waits behind another hands none: the outbox looks.
        handed = Wakes(outbox=True, rows=(first,))
        assert (handed | Wakes(outbox=True)).rows == ()
        assert (handed | Wakes(deadline=START)).rows == (first,)
        assert handed == Wakes(outbox=True)  # the rows are no part of what woke

    run_env(tmp_path, body, clock=TestClock(START))


def test_a_handed_row_whose_queue_is_busy_waits_and_goes_once(tmp_path: Path) -> None:
    """Handed while its queue's send is under way (a look found and started it first):
    not sent again once that send ends."""

    async def body(env: Env) -> None:
        got = await deliver(env, INTAKE, inbound(INTAKE)[0])
        transport = MemoryMailTransport()
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), mail=transport)
        outbox.start()  # its first look finds the row
        try:
            await transport.wait_for(1)
            outbox.wake(got.wakes.queues, got.wakes.rows)  # the same row, handed late
            await settled(outbox)
            await asyncio.sleep(0.2)
        finally:
            await outbox.stop()
        assert len(transport.sent) == 1

    run_env(tmp_path, body, clock=TestClock(START))


def test_a_handed_acknowledgement_is_the_row_as_stored_bounce_address_included(
    tmp_path: Path,
) -> None:
    """The row's payload is written again once its id gives the bounce address: the row
    handed with the wake is that one, so the mail goes out from its bounce address."""

    async def body(env: Env) -> None:
        got = await deliver(env, INTAKE, inbound(INTAKE)[0])
        (handed,) = got.wakes.rows
        stored = (await query(env, "SELECT payload FROM outbox WHERE id = ?", (handed.id,)))[0]
        assert handed.payload == stored["payload"]
        transport = MemoryMailTransport()
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), mail=transport)
        outbox.start()
        try:
            await transport.wait_for(1)
        finally:
            await outbox.stop()
        case = (await query(env, "SELECT address FROM cases"))[0]["address"]
        (sent,) = transport.sent
        assert sent.mail_from == json.loads(stored["payload"])["mail_from"] != case

    run_env(tmp_path, body, clock=TestClock(START))
