"""``kill -9`` under load: nothing acknowledged is lost, nothing is recorded twice.

masd runs as a real process, with a mode endpoint (:class:`~masd.testing.FakePeer`)
and a mail relay (:class:`~masd.testing.SmtpSink`).  Mail goes in over LMTP
from :data:`WORKERS` clients that behave like Postfix (again after a ``4xx``
or a lost connection, until ``250``); some of it asks for the ``callback``
mode, and the endpoint answers each ``handoff.request`` with a
``handoff.status`` callback, posted again with the same ``id`` until masd
acknowledges it.  Meanwhile masd is killed with SIGKILL :data:`KILLS` times,
spread over the deliveries, and started again at once.

Afterwards the store must hold each acknowledged delivery and each
acknowledged callback exactly once (docs/protocol.md §3 "250 ... durably committed";
§6 idempotency), and every acknowledgement and request must have left at
least once (docs/protocol.md §10).
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.faults import Handover, counts, handover, times_each
from support.masd_process import MasdProcess, MasterSetup, write_master_config

from masd.testing import FakePeer, Recorded, SmtpSink

pytestmark = [pytest.mark.fault, pytest.mark.slow]

DELIVERIES = 2000
KILLS = 6
WORKERS = 16
#: One mail in this many asks for the callback mode (a handoff and a callback).
CALLBACK_EVERY = 3
#: Bound of the whole run; it normally takes a small part of it.
DEADLINE = 300.0


@dataclass
class Callback:
    """One ``handoff.status`` the endpoint posts until masd acknowledges it."""

    handoff_id: str
    message: dict[str, Any]
    first: float = 0.0
    acknowledged: float | None = None
    attempts: int = 0


@dataclass
class Load:
    setup: MasterSetup
    masd: MasdProcess
    http: httpx.AsyncClient
    handovers: list[Handover] = field(default_factory=list)
    callbacks: dict[str, Callback] = field(default_factory=dict)  # by handoff id
    posting: list[asyncio.Task[None]] = field(default_factory=list)
    accepted: int = 0
    kills: int = 0
    restart_seconds: list[float] = field(default_factory=list)

    def endpoint(self, rec: Recorded) -> tuple[int, Any]:
        """The mode endpoint: 200 to every request; one callback per new handoff."""
        body = rec.json if isinstance(rec.json, dict) else {}
        handoff_id = body.get("handoff_id")
        if body.get("type") == "handoff.request" and handoff_id not in self.callbacks:
            callback = Callback(
                str(handoff_id),
                {
                    "mas_modes_version": "0.1",
                    "type": "handoff.status",
                    "id": secrets.token_hex(16),
                    "case": body["case"],
                    "handoff_id": handoff_id,
                    "seq": 1,
                    "status": "running",
                },
            )
            self.callbacks[callback.handoff_id] = callback
            self.posting.append(asyncio.create_task(self.post(callback)))
        return 200, {"ok": True}

    async def post(self, callback: Callback) -> None:
        loop = asyncio.get_running_loop()
        callback.first = loop.time()
        auth = {"Authorization": f"Bearer {self.setup.endpoint_token}"}
        while True:
            callback.attempts += 1
            try:
                answer = await self.http.post(
                    self.setup.messages_url, json=callback.message, headers=auth
                )
            except httpx.HTTPError:
                pass  # masd is down or was killed mid-request: the same id again
            else:
                if answer.status_code == 200:
                    callback.acknowledged = loop.time()
                    return
                assert answer.status_code == 503, answer.text
            await asyncio.sleep(0.2)

    async def deliver(self, queue: asyncio.Queue[Handover]) -> None:
        while not queue.empty():
            item = queue.get_nowait()
            await item.run(retry=0.2, give_up=DEADLINE)
            self.accepted += 1

    async def kill_along(self) -> None:
        """SIGKILL masd each time another share of the deliveries has been acknowledged."""
        loop = asyncio.get_running_loop()
        for k in range(1, KILLS + 1):
            while self.accepted < k * DELIVERIES // (KILLS + 1):
                await asyncio.sleep(0.01)
            self.masd.kill()
            self.kills += 1
            began = loop.time()
            await self.masd.start()
            self.restart_seconds.append(loop.time() - began)


def the_mail(setup: MasterSetup, n: int) -> Handover:
    lmtp = ("127.0.0.1", setup.lmtp_port)
    sender = f"user{n}@example.org"  # one participant per case: no send cap is reached
    if n % CALLBACK_EVERY == 0:
        return handover(lmtp, sender, "ticket!callback@help.example", body=f"phone: {n}\n")
    return handover(lmtp, sender, "ticket@help.example", subject=f"Mail {n}")


def outbox_left(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM outbox WHERE state != 'done'").fetchone()[0])
    finally:
        conn.close()


async def until(test: Any, what: str, began: float) -> None:
    while not test():
        assert time.monotonic() - began < DEADLINE, f"{what}: not within {DEADLINE:g} s"
        await asyncio.sleep(0.1)


def test_kill_9_under_load_loses_nothing_and_records_nothing_twice(tmp_path: Path) -> None:
    async def main() -> None:
        load: Load | None = None

        def script(rec: Recorded) -> tuple[int, Any]:
            assert load is not None
            return load.endpoint(rec)

        async with FakePeer(script) as peer, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path / "masd", endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            async with (
                MasdProcess(setup.config, tmp_path / "masd.log") as masd,
                httpx.AsyncClient(timeout=10.0) as http,
            ):
                load = Load(setup, masd, http)
                await run_load(load, peer, sink)

    asyncio.run(main())


async def run_load(load: Load, peer: FakePeer, sink: SmtpSink) -> None:
    began = time.monotonic()
    queue: asyncio.Queue[Handover] = asyncio.Queue()
    for n in range(DELIVERIES):
        mail = the_mail(load.setup, n)
        load.handovers.append(mail)
        queue.put_nowait(mail)
    killer = asyncio.create_task(load.kill_along())
    await asyncio.gather(*(load.deliver(queue) for _ in range(WORKERS)))
    await killer
    delivered = time.monotonic() - began
    wanted = DELIVERIES // CALLBACK_EVERY + (DELIVERIES % CALLBACK_EVERY > 0)
    await until(lambda: len(load.callbacks) >= wanted, "a handoff.request per callback mail", began)
    await asyncio.gather(*load.posting)
    db = load.setup.config.with_name("masd.db")
    await until(lambda: outbox_left(db) == 0, "the outbox drained", began)
    assert await load.masd.terminate() == 0
    report(load, peer, sink, db, delivered, time.monotonic() - began)


def report(
    load: Load, peer: FakePeer, sink: SmtpSink, db: Path, delivered: float, seconds: float
) -> None:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = dict(conn.execute("SELECT message_id, count(*) FROM messages GROUP BY 1"))
        statuses = dict(
            conn.execute(
                "SELECT handoff_id, count(*) FROM statuses WHERE source = 'mode' GROUP BY 1"
            )
        )
        cases = conn.execute("SELECT count(*) FROM cases").fetchone()[0]
        handoffs = conn.execute("SELECT count(*) FROM handoffs").fetchone()[0]
    finally:
        conn.close()
    mails = load.handovers
    lost = [m.message_id for m in mails if m.message_id not in stored]
    twice = [mid for mid, n in stored.items() if n > 1]
    calls = list(load.callbacks.values())
    calls_lost = [c.handoff_id for c in calls if c.handoff_id not in statuses]
    calls_twice = [h for h, n in statuses.items() if n > 1]
    acks = times_each([m.rcpt_tos[0] for m in sink.messages])
    requests = times_each([str(r.json["id"]) for r in peer.requests if isinstance(r.json, dict)])
    print(
        f"\nkill -9 loop: {load.kills} kills during {DELIVERIES} deliveries"
        f" ({delivered:.1f} s; {seconds:.1f} s until everything was sent), restarts"
        f" {min(load.restart_seconds):.2f}-{max(load.restart_seconds):.2f} s"
        "\n"
        + counts(
            "deliveries",
            sent=sum(m.attempts for m in mails),
            recorded=len(stored),
            repeated=len(twice),
            lost=len(lost),
            delays=[m.delay for m in mails],
        )
        + "\n"
        + counts(
            "acknowledged callbacks",
            sent=sum(c.attempts for c in calls),
            recorded=len(statuses),
            repeated=len(calls_twice),
            lost=len(calls_lost),
            delays=[c.acknowledged - c.first for c in calls if c.acknowledged is not None],
        )
        + f"\noutbound, at least once: {len(acks)} participants acknowledged"
        f" ({sum(acks.values()) - len(acks)} sent again after a kill), {len(requests)}"
        f" handoff.requests ({sum(requests.values()) - len(requests)} sent again)"
    )
    assert load.kills >= 5
    assert lost == []
    assert twice == []
    assert cases == DELIVERIES
    assert calls_lost == []
    assert calls_twice == []
    assert handoffs == len(calls)
    assert len(acks) == DELIVERIES  # every participant was acknowledged at least once
    assert len(requests) == len(calls)
