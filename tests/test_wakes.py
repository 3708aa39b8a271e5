"""Exact wake-ups: a commit wakes the outbox and the deadline timer only for work it gave them.

masd runs in-process (:class:`masd.app.App`) on a test clock, with its LMTP
listener on a unix socket and HTTP on loopback port 0, one FakePeer as both mode endpoints
(callback: deadline 1 h, chat: 4 h) and an SmtpSink as the relay.  The
clock is advanced on the clock object itself, not through the test clock
route (which wakes everything), so a deadline fires only if the commit that
wrote it woke the timer.  Wakes are read from ``/metrics``
(``masd_timer_wakes_total``, ``masd_outbox_wakes_total``), as an operator
would read them.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from support.masd_process import mx_mail
from support.outbox import CALLBACK_TOKEN as OUTBOX_CALLBACK_TOKEN
from support.outbox import deliver, eventually, inbound, make_env, query

from masd import service
from masd.app import App
from masd.clock import TestClock
from masd.config import load_config
from masd.core import wire
from masd.edges.http.shared import status_of
from masd.service import NO_WAKES, Wakes
from masd.testing import FakePeer, SmtpSink, lmtpclient

START = 1_800_000_000.0
HOUR = 3600.0
CALLBACK_TOKEN = "callback-secret-0e7d41aa"
CHAT_TOKEN = "chat-secret-93bb2c10"
ADMIN_TOKEN = "admin-secret-5a1f77e3"
SENDER = "ann@example.org"
WAIT = 10.0


def write_config(tmp: Path, peer: FakePeer, sink: SmtpSink) -> Path:
    for name, token in (("callback", CALLBACK_TOKEN), ("chat", CHAT_TOKEN), ("admin", ADMIN_TOKEN)):
        path = tmp / f"{name}.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
    config = tmp / "masd.toml"
    config.write_text(
        f"""\
[server]
lmtp = "unix:{tmp / "lmtp.sock"}"
http = "127.0.0.1:0"
database = "{tmp / "masd.db"}"
smtp_relay = "127.0.0.1:{sink.port}"
trusted_authserv_ids = ["mx.help.example"]
admin_token_file = "admin.token"
retry_for = "1h"

[domains."help.example".types.ticket]
role = "master"
modes = ["callback", "chat"]
id_prefix = "gs-"

[domains."help.example".types.ticket.endpoints.callback]
url = "{peer.url}callback"
token_file = "callback.token"
deadline = "1h"

[domains."help.example".types.ticket.endpoints.chat]
url = "{peer.url}chat"
token_file = "chat.token"
deadline = "4h"
"""
    )
    return config


@dataclass
class Masd:
    app: App
    clock: TestClock
    http: httpx.AsyncClient
    lmtp: str
    peer: FakePeer
    sink: SmtpSink

    async def mail(self, rcpt: str, *, dmarc: str | None = "pass") -> None:
        """Deliver a mail over LMTP (``dmarc=None``: no trusted A-R); it must be recorded."""
        _, raw = mx_mail(SENDER, rcpt, dmarc=dmarc)
        result = await lmtpclient.deliver(self.lmtp, SENDER, [rcpt], raw, timeout=WAIT)
        assert result.codes == (250,), result

    async def counter(self, name: str) -> float:
        text = (await self.http.get("/metrics")).text
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert found is not None, f"{name} is not on /metrics"
        return float(found.group(1))

    async def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        store = self.app.store
        assert store is not None
        return await store.read(lambda db: [tuple(r) for r in db.execute(sql, params)])

    async def status(self, case_key: str, handoff_id: str, seq: int, status: str) -> None:
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": f"st-{secrets.token_hex(6)}",
            "case": {"address": case_key, "key": case_key},
            "handoff_id": handoff_id,
            "seq": seq,
            "status": status,
        }
        got = await self.http.post(
            "/mas/v0.1/messages",
            content=json.dumps(message),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {CALLBACK_TOKEN}",
            },
        )
        assert got.status_code == 200, got.text
        assert got.json() == {"ok": True}


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Masd]:
    peer = await FakePeer().start()
    sink = await SmtpSink().start()
    clock = TestClock(START)
    app: App | None = None
    try:
        app = App(load_config(write_config(tmp_path, peer, sink)), clock=clock, sockets={})
        listening = await app.start()
        http = listening.http.addresses[0]
        assert isinstance(http, tuple)
        async with httpx.AsyncClient(base_url=f"http://{http[0]}:{http[1]}", timeout=WAIT) as c:
            yield Masd(app, clock, c, str(tmp_path / "lmtp.sock"), peer, sink)
    finally:
        if app is not None:
            await app.stop()
        await peer.close()
        await sink.close()


def run(tmp_path: Path, body: Callable[[Masd], Any]) -> None:
    async def main() -> None:
        async with running(tmp_path) as masd:
            await body(masd)

    asyncio.run(main())


async def handoffs(masd: Masd) -> dict[str, tuple[str, str]]:
    """mode -> (handoff id, status)."""
    rows = await masd.query("SELECT mode, handoff_id, status FROM handoffs")
    return {mode: (hid, status) for mode, hid, status in rows}


def test_a_sooner_deadline_wakes_the_timer_sleeping_until_a_later_one(tmp_path: Path) -> None:
    async def body(masd: Masd) -> None:
        timer = masd.app.timer
        await masd.mail("ticket!chat@help.example")  # a deadline 4 h from now
        await eventually(lambda: timer.sleeps_until == START + 4 * HOUR, "the timer to sleep 4 h")
        wakes = await masd.counter("masd_timer_wakes_total")
        await masd.mail("ticket!callback@help.example")  # 1 h: sooner
        assert await masd.counter("masd_timer_wakes_total") == wakes + 1
        masd.clock.advance(HOUR + 1)  # not through the clock route: that wakes the timer too

        async def callback_timed_out() -> bool:
            return (await handoffs(masd))["callback"][1] == "timed-out"

        await eventually(callback_timed_out, "the callback handoff to time out")
        assert (await handoffs(masd))["chat"][1] == "requested"
        assert await masd.counter("masd_deadlines_fired_total") == 1
        assert timer.sleeps_until == START + 4 * HOUR

    run(tmp_path, body)


def test_a_later_deadline_leaves_the_timer_asleep(tmp_path: Path) -> None:
    async def body(masd: Masd) -> None:
        timer = masd.app.timer
        await masd.mail("ticket!callback@help.example")  # 1 h
        await eventually(lambda: timer.sleeps_until == START + HOUR, "the timer to sleep 1 h")
        wakes = await masd.counter("masd_timer_wakes_total")
        await masd.mail("ticket!chat@help.example")  # 4 h: after the one it waits for
        assert await masd.counter("masd_timer_wakes_total") == wakes
        assert timer.sleeps_until == START + HOUR
        masd.clock.advance(HOUR + 1)

        async def callback_timed_out() -> bool:
            return (await handoffs(masd))["callback"][1] == "timed-out"

        await eventually(callback_timed_out, "the callback handoff to time out")
        # Having fired, the timer found the later deadline by itself.
        await eventually(lambda: timer.sleeps_until == START + 4 * HOUR, "the timer to sleep 4 h")

    run(tmp_path, body)


def test_plain_intake_and_a_negotiating_status_wake_neither_loop(tmp_path: Path) -> None:
    async def body(masd: Masd) -> None:
        assert await masd.counter("masd_timer_wakes_total") == 0
        assert await masd.counter("masd_outbox_wakes_total") == 0
        # A !callback mail queues the handoff.request and the acknowledgement
        # and opens a deadline: both loops are woken, and the rows go out.
        await masd.mail("ticket!callback@help.example")
        assert await masd.counter("masd_timer_wakes_total") == 1
        assert await masd.counter("masd_outbox_wakes_total") == 1
        [request] = await masd.peer.wait_for(1, timeout=WAIT)
        assert isinstance(request.json, dict)
        assert request.json["type"] == "handoff.request"
        await masd.sink.wait_for(1, timeout=WAIT)
        [(case_key, handoff_id)] = await masd.query("SELECT case_key, handoff_id FROM handoffs")

        # Plain intake mail: a new case, its acknowledgement refused (the
        # sender is not authenticated: Principle 10); nothing queued, no deadline.
        await masd.mail("ticket@help.example", dmarc=None)
        [(refused,)] = await masd.query(
            "SELECT json_extract(data, '$.reason') FROM thread WHERE kind = 'mail.refused'"
        )
        assert refused == "unauthenticated-sender"
        # A negotiating status without needs: recorded, nothing queued.
        await masd.status(case_key, handoff_id, 1, "negotiating")
        assert (await handoffs(masd))["callback"][1] == "negotiating"
        assert await masd.counter("masd_timer_wakes_total") == 1
        assert await masd.counter("masd_outbox_wakes_total") == 1

        # The test clock route still wakes the timer (and the outbox).
        moved = await masd.http.post(
            "/mas/v0.1/test/clock",
            json={"advance": 0},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert moved.status_code == 200, moved.text
        assert await masd.counter("masd_timer_wakes_total") == 2
        assert await masd.counter("masd_outbox_wakes_total") == 2

    run(tmp_path, body)


def test_a_status_that_queues_a_mail_wakes_the_outbox_and_the_mail_goes_out(
    tmp_path: Path,
) -> None:
    async def body(masd: Masd) -> None:
        await masd.mail("ticket!callback@help.example")
        await masd.peer.wait_for(1, timeout=WAIT)
        await masd.sink.wait_for(1, timeout=WAIT)  # the acknowledgement
        [(case_key, handoff_id)] = await masd.query("SELECT case_key, handoff_id FROM handoffs")
        timer_wakes = await masd.counter("masd_timer_wakes_total")
        outbox_wakes = await masd.counter("masd_outbox_wakes_total")
        await masd.status(case_key, handoff_id, 1, "running")  # nothing to send
        assert await masd.counter("masd_outbox_wakes_total") == outbox_wakes
        await masd.status(case_key, handoff_id, 2, "completed")  # the resume mail
        assert await masd.counter("masd_outbox_wakes_total") == outbox_wakes + 1
        assert await masd.counter("masd_timer_wakes_total") == timer_wakes
        mails = await masd.sink.wait_for(2, timeout=WAIT)
        assert mails[1].rcpt_tos == (SENDER,)
        assert case_key in mails[1].message.get_content()

    run(tmp_path, body)


# --------------------------------------------------------------------------- what each job reports


def plain(rcpt: str) -> bytes:
    """A mail with no Authentication-Results: its sender is not authenticated."""
    return (
        f"From: Bob <bob@example.net>\r\nTo: {rcpt}\r\nSubject: Hello\r\n"
        f"Message-ID: <{secrets.token_hex(8)}@example.net>\r\n\r\nHello.\r\n"
    ).encode()


def test_a_delivery_reports_what_it_queued_and_the_deadline_it_wrote(tmp_path: Path) -> None:
    async def main() -> None:
        env = await make_env(tmp_path, clock=TestClock(START), deadline="1h")
        try:
            # Plain intake, acknowledgement refused (Principle 10): nothing for either loop.
            got = await deliver(env, "ticket@help.example", plain("ticket@help.example"))
            assert got.wakes == NO_WAKES
            # Authenticated: the acknowledgement is queued, no deadline.
            raw, _ = inbound("ticket@help.example")
            got = await deliver(env, "ticket@help.example", raw)
            assert got.wakes == Wakes(outbox=True)
            # A handoff: the request and the acknowledgement, and the deadline.
            raw, _ = inbound("ticket!callback@help.example")
            got = await deliver(env, "ticket!callback@help.example", raw)
            assert got.wakes == Wakes(outbox=True, deadline=START + HOUR)
            # The same mail again is recorded once: nothing written, nothing to wake.
            again = await deliver(env, "ticket!callback@help.example", raw)
            assert again.duplicate
            assert again.wakes == NO_WAKES
        finally:
            await env.close()

    asyncio.run(main())


def test_a_status_reports_what_it_recorded_and_a_refusal_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        env = await make_env(tmp_path, clock=TestClock(START), deadline="1h")
        try:
            raw, _ = inbound("ticket!callback@help.example")
            case_key = (await deliver(env, "ticket!callback@help.example", raw)).case_key
            [row] = await query(env, "SELECT handoff_id FROM handoffs")
            hid = row["handoff_id"]
            who = env.rt.directory.authenticate(OUTBOX_CALLBACK_TOKEN)
            assert who is not None

            async def post(seq: int, status: str, **extra: Any) -> service.Received:
                body = {
                    "mas_modes_version": "0.1",
                    "type": "handoff.status",
                    "id": f"st-{seq}-{status}",
                    "case": {"address": case_key, "key": case_key},
                    "handoff_id": hid,
                    "seq": seq,
                    "status": status,
                    **extra,
                }
                message = wire.parse_envelope(json.dumps(body).encode())
                now = env.clock.now()
                return await env.store.write(
                    lambda db: service.receive(env.rt, db, who, message, now, status_of)
                )

            got = await post(1, "negotiating")
            assert (got.status, got.wakes) == (200, NO_WAKES)
            assert [(s.handoff_id, s.status, s.seq) for s in got.statuses] == [
                (hid, "negotiating", 1)
            ]
            # With needs the participant is asked: a mail is queued.
            got = await post(2, "negotiating", needs=["phone"])
            assert got.wakes == Wakes(outbox=True)
            # Refused (negotiating -> completed): rolled back, nothing recorded.
            got = await post(3, "completed")
            assert (got.status, got.wakes, got.statuses) == (409, NO_WAKES, ())
            # Stale: answered, nothing recorded.
            got = await post(2, "running")
            assert (got.status, got.statuses) == (200, ())
            statuses = await query(env, "SELECT n, status FROM statuses ORDER BY n")
            assert [(r["n"], r["status"]) for r in statuses] == [
                (1, "requested"),
                (2, "negotiating"),
                (3, "negotiating"),
            ]
        finally:
            await env.close()

    asyncio.run(main())


def test_a_deadline_firing_reports_the_rows_it_queued(tmp_path: Path) -> None:
    async def main() -> None:
        env = await make_env(tmp_path, clock=TestClock(START), deadline="1h")
        try:
            raw, _ = inbound("ticket!callback@help.example")
            await deliver(env, "ticket!callback@help.example", raw)
            [row] = await query(env, "SELECT handoff_id FROM handoffs")
            hid, rt, now = row["handoff_id"], env.rt, START + HOUR + 1
            fired = await env.store.write(lambda db: service.fire_deadline(rt, db, hid, now))
            assert fired == Wakes(outbox=True)  # the cancel and the resume mail
            again = await env.store.write(lambda db: service.fire_deadline(rt, db, hid, now))
            assert again is None  # closed: nothing was due
        finally:
            await env.close()

    asyncio.run(main())
