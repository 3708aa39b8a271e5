"""Two masd processes on one PostgreSQL database, one killed with SIGKILL mid-run.

Hosts A and B run ``masd serve`` with the same configuration but their own LMTP and HTTP
ports (``claim_timeout`` 2 s, endpoint deadline 6 s).  The mode endpoint answers each
request after :data:`PEER_DELAY` seconds, so both outboxes have rows in flight.  Mail
(plain, acknowledged by mail, and ``!callback``, also posting a ``handoff.request``)
and ``handoff.status`` messages are spread over both hosts; then A is killed with
``kill -9`` while its outbox holds work, and more mail goes to B.

Counted and printed at the end: every message recorded once; every acknowledgement and
every ``handoff.request`` delivered, repeats only with the same Message-ID or ``id`` and
at most one per row A held at the kill; every deadline fired once; the event feed read
from either host identical (A started again to read it).  Also measured and printed: how
long an event committed on one host takes to reach a long poll on the other (the hosts
poll each other's commits, bounded by one second).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support.masd_process import MasdProcess, MasterSetup, mx_mail
from support.postgres import Database, postgres_server, two_hosts  # noqa: F401
from support.postgres import postgres as postgres

from masd.testing import FakePeer, Recorded, SmtpSink, lmtpclient

pytestmark = [pytest.mark.slow, pytest.mark.fault]

PEER_DELAY = 1.0
#: Mails before the kill (half of them !callback), and after it (to B).
BEFORE, AFTER = 16, 6
WAIT = 60.0


def configs(directory: Path, db: Database, peer: FakePeer, sink: SmtpSink) -> list[MasterSetup]:
    hosts = two_hosts(
        directory,
        db,
        endpoint_url=peer.url + "mas",
        smtp_port=sink.port,
        deadline="6s",
        server_lines='claim_timeout = "2s"\n',
    )
    return list(hosts)


async def mail(setup: MasterSetup, n: int, callback: bool) -> str:
    sender = f"user{n}@example.org"
    rcpt = "ticket!callback@help.example" if callback else "ticket@help.example"
    body = "phone: +1 555 0100\n" if callback else "Hello.\n"
    message_id, data = mx_mail(sender, rcpt, subject=f"Mail {n}", body=body)
    target = ("127.0.0.1", setup.lmtp_port)
    while True:  # as Postfix does: a temporary failure is tried again
        result = await lmtpclient.deliver(target, sender, [rcpt], data)
        if result.codes == (250,):
            return message_id
        await asyncio.sleep(0.5)


def status(request: Recorded) -> dict[str, Any]:
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": secrets.token_hex(16),
        "case": request.json["case"],
        "handoff_id": request.json["handoff_id"],
        "seq": 1,
        "status": "running",
    }


def query(db: Database, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.uri, password=db.password) as conn:
        return conn.execute(sql).fetchall()


async def feed(http: httpx.AsyncClient, setup: MasterSetup) -> list[dict[str, Any]]:
    auth = {"Authorization": f"Bearer {setup.admin_token}"}
    got: list[dict[str, Any]] = []
    after = ""
    while True:
        params = {"limit": "1000", **({"after": after} if after else {})}
        page = (
            await http.get(setup.http_url + "/mas/v0.1/events", params=params, headers=auth)
        ).json()
        got += page["events"]
        if not page["events"]:
            return got
        after = page["next"]


async def wake_latency(
    http: httpx.AsyncClient, listen: MasterSetup, write: MasterSetup, n: int
) -> float:
    """Seconds from a mail's 250 on ``write`` to a long poll on ``listen`` returning it."""
    auth = {"Authorization": f"Bearer {listen.admin_token}"}
    last = (await feed(http, listen))[-1]["cursor"]
    params = {"after": last, "wait": "10"}
    poll = asyncio.create_task(
        http.get(listen.http_url + "/mas/v0.1/events", params=params, headers=auth)
    )
    await asyncio.sleep(0.2)  # the long poll is waiting
    await mail(write, n, callback=False)
    committed = time.monotonic()
    answer = await poll
    assert answer.json()["events"], answer.text
    return time.monotonic() - committed


def test_two_hosts_one_killed_mid_run(tmp_path: Path, postgres: Database) -> None:
    async def slow(_: Recorded) -> tuple[int, object]:
        await asyncio.sleep(PEER_DELAY)
        return 200, {"ok": True}

    async def scenario() -> None:
        async with FakePeer(slow) as peer, SmtpSink() as sink:
            a, b = configs(tmp_path, postgres, peer, sink)
            host_a = MasdProcess(a.config, tmp_path / "a.log")
            host_b = MasdProcess(b.config, tmp_path / "b.log")
            async with host_a, host_b, httpx.AsyncClient(timeout=WAIT) as http:
                await play(http, peer, sink, (a, b), (host_a, host_b), postgres)

    asyncio.run(scenario())


async def play(
    http: httpx.AsyncClient,
    peer: FakePeer,
    sink: SmtpSink,
    setups: tuple[MasterSetup, MasterSetup],
    hosts: tuple[MasdProcess, MasdProcess],
    db: Database,
) -> None:
    a, b = setups
    ids = await asyncio.gather(
        *(mail(setups[n % 2], n, callback=n % 2 == 1) for n in range(BEFORE))
    )
    callbacks = BEFORE // 2
    requests = await peer.wait_for(callbacks // 2, WAIT)
    auth = {"Authorization": f"Bearer {a.endpoint_token}"}
    posted = [
        await http.post(setups[i % 2].messages_url, json=status(r), headers=auth)
        for i, r in enumerate(requests[: callbacks // 2])
    ]
    assert {p.status_code for p in posted} == {200}, [p.text for p in posted]
    held = query(
        db, "SELECT count(*) FROM outbox WHERE state = 'pending' AND claimed_by IS NOT NULL"
    )
    hosts[0].kill()  # kill -9: A's sends in flight are cut short, its leases left behind
    killed = time.monotonic()
    ids += [await mail(b, BEFORE + n, callback=n % 2 == 1) for n in range(AFTER)]
    callbacks += AFTER // 2
    await wait_for_all(peer, sink, db, len(ids), callbacks)
    taken_over = time.monotonic() - killed
    await hosts[0].start()  # A again, to read the feed from both
    feeds = [await feed(http, s) for s in setups]
    report(peer, sink, db, ids, callbacks, held[0][0], feeds, taken_over)
    latencies = [
        await wake_latency(http, setups[i % 2], setups[(i + 1) % 2], 100 + i) for i in range(6)
    ]
    print(
        f"wake latency between hosts (a commit on one, a long poll on the other): median "
        f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )


async def wait_for_all(
    peer: FakePeer, sink: SmtpSink, db: Database, mails: int, callbacks: int
) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT
    while True:
        requests = {r.json["id"] for r in peer.requests if r.json.get("type") == "handoff.request"}
        acks = {m.message["In-Reply-To"] for m in sink.messages}
        fired = query(db, "SELECT count(*) FROM statuses WHERE status = 'timed-out'")[0][0]
        pending = query(db, "SELECT count(*) FROM outbox WHERE state = 'pending'")[0][0]
        if len(requests) >= callbacks and len(acks) >= mails and fired >= callbacks and not pending:
            return
        assert loop.time() < until, (len(requests), len(acks), fired, pending)
        await asyncio.sleep(0.5)


def report(
    peer: FakePeer,
    sink: SmtpSink,
    db: Database,
    ids: list[str],
    callbacks: int,
    held: int,
    feeds: list[list[dict[str, Any]]],
    taken_over: float,
) -> None:
    recorded = Counter(r[0] for r in query(db, "SELECT message_id FROM messages"))
    sent = Counter(str(r.json["id"]) for r in peer.requests)
    acks = Counter(str(m.message["Message-ID"]) for m in sink.messages)
    fired = Counter(
        r[0] for r in query(db, "SELECT handoff_id FROM statuses WHERE status = 'timed-out'")
    )
    repeats = sum(n - 1 for n in sent.values()) + sum(n - 1 for n in acks.values())
    print(
        f"\nmessages {len(ids)}: recorded {sum(recorded.values())} (once each: "
        f"{all(recorded[i] == 1 for i in ids)}); handoff.requests {callbacks}; contract "
        f"messages sent {len(sent)} distinct ids, mails sent (acknowledgements and timeout "
        f"notices) {len(acks)} distinct Message-IDs; repeats {repeats} (rows held by the "
        f"hosts at the kill: {held}); "
        f"deadlines fired {sum(fired.values())} for {len(fired)} handoffs; feed "
        f"{len(feeds[0])} events on A, {len(feeds[1])} on B; everything delivered "
        f"{taken_over:.1f} s after the kill"
    )
    assert all(recorded[i] == 1 for i in ids), recorded
    assert sum(recorded.values()) == len(ids)
    answered = Counter(str(m.message["In-Reply-To"]) for m in sink.messages)
    assert all(answered[i] >= 1 for i in ids), answered  # each mail acknowledged
    assert len({k for k in sent if sent[k] and k}) >= callbacks
    assert repeats <= held, (sent, acks)
    assert len(fired) == callbacks
    assert set(fired.values()) == {1}
    assert feeds[0] == feeds[1]
