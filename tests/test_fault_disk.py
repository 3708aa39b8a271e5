"""A store fault episode in a running masd: the disk fills while mail and contract messages flow.

masd runs in this process (:class:`masd.app.App`) on loopback, with a mode
endpoint (:class:`~masd.testing.FakePeer`) and a mail relay
(:class:`~masd.testing.SmtpSink`). Before the fault, masd has mail and
``handoff.request`` messages on their way: the endpoint holds its answers, the
relay refuses the first acknowledgements once (too few to open its circuit).
Then the disk fills: a tmpfs filled to the last byte (as root, which CI is), or
a full disk injected through the store's seam
(:class:`support.faults.DiskFull`). The endpoint answers, the relay accepts, but
masd cannot record either; new mail comes in like Postfix sends it, the endpoint
posts statuses. Then the disk is freed.

A real full disk refuses only the writes that need room.  masd's own
checkpoints start the WAL over and cut it to ``journal_size_limit``, so a
commit that fits in the log's kept pages succeeds while the filler still fills
the disk: on the tmpfs a small write (a status) may be recorded during the
fault, and the store's health goes back and forth with the writes that fit.
What is checked there is what holds whichever writes fit; the seam refuses
every write, and there the ``503`` answers and the health seen during the
fault are checked too (:attr:`Episode.every_write_refused`).

What must hold (docs/protocol.md §3, §9, §10): LMTP answers ``451 4.3.0`` and HTTP
``503`` with ``Retry-After`` while the store cannot commit, ``/healthz`` says
so, masd recovers with no restart, nothing acknowledged is lost or recorded
twice, and no mail and no contract message is sent more than twice while the
store refuses writes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.faults import DiskFull, Handover, counts, fill, open_with_seam, times_each, tmpfs
from support.masd_process import WAIT, MasterSetup, mx_mail, wait_until, write_master_config

import masd.app
from masd.app import App
from masd.config import load_config
from masd.edges.lanes import FAILURES_TO_OPEN
from masd.testing import FakePeer, Recorded, SmtpSink

pytestmark = [pytest.mark.fault, pytest.mark.slow]

#: Cases of each kind (an acknowledgement only; a handoff too) made before the fault.
CASES = 6
#: Mails that arrive (and are retried) while the store cannot commit.
DURING = 8
#: Acknowledgements the relay refuses once before the fault: fewer than open its circuit.
#: Twelve refusals in a row opened it and each further probe waited out a growing pause
#: (0.6 s up to 41 s), so how long they took depended on how many went out at once.
REFUSED = FAILURES_TO_OPEN - 1
#: How long the store refuses writes once the peers answer.
FAULT_SECONDS = 4.0


@dataclass
class Episode:
    setup: MasterSetup
    app: App
    peer: FakePeer
    sink: SmtpSink
    http: httpx.AsyncClient
    #: True where every write fails during the fault (the seam), False on a real full disk.
    every_write_refused: bool
    handovers: list[Handover] = field(default_factory=list)
    posted: dict[str, int] = field(default_factory=dict)  # status id -> HTTP answers seen
    acknowledged: set[tuple[str, int]] = field(default_factory=set)  # (handoff_id, seq)
    replies: list[int] = field(default_factory=list)  # HTTP statuses of the status posts

    @property
    def lmtp(self) -> tuple[str, int]:
        return ("127.0.0.1", self.setup.lmtp_port)

    def handover(self, n: int, rcpt: str, body: str = "Hello.\n") -> Handover:
        sender = f"user{n}@example.org"
        message_id, data = mx_mail(sender, rcpt, subject=f"Mail {n}", body=body)
        handover = Handover(self.lmtp, sender, rcpt, data, message_id)
        self.handovers.append(handover)
        return handover

    async def until_refused(self, first: int) -> asyncio.Task[Handover]:
        """Hand over mail until one is refused; that one goes on as Postfix would.

        A full disk shows at the first write that needs room: SQLite reuses the
        space of its log, so a few mails may still be recorded (and are)."""
        for n in range(first, first + 200):
            handover = self.handover(n, "ticket@help.example", body="A long mail.\n" * 2000)
            task = asyncio.create_task(handover.run())
            while not (handover.replies or task.done()):
                await asyncio.sleep(0.01)
            if handover.replies:
                return task
        raise AssertionError("no delivery was refused on a full disk")

    async def post_status(self, request: Recorded, seq: int, status: str) -> None:
        """As a mode endpoint: POST until 2xx, honouring Retry-After (capped: a test)."""
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": secrets.token_hex(16),
            "case": request.json["case"],
            "handoff_id": request.json["handoff_id"],
            "seq": seq,
            "status": status,
        }
        auth = {"Authorization": f"Bearer {self.setup.endpoint_token}"}
        while True:
            answer = await self.http.post(self.setup.messages_url, json=message, headers=auth)
            self.replies.append(answer.status_code)
            if answer.status_code == 200:
                self.acknowledged.add((message["handoff_id"], seq))
                return
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "unavailable"
            await asyncio.sleep(min(1.0, float(answer.headers["retry-after"])))


def sends(peer: FakePeer, sink: SmtpSink) -> dict[str, int]:
    """Sends of each message so far: contract messages by id, mail by Message-ID (the
    relay's refusals count: each was a send)."""
    ids = [str(r.json["id"]) for r in peer.requests if isinstance(r.json, dict)]
    mails = [str(m.message["Message-ID"]) for m in [*sink.messages, *sink.refused]]
    return times_each(ids + mails)


async def gauge(http: httpx.AsyncClient, name: str) -> float:
    text = (await http.get("/metrics")).text
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])


async def recorded(app: App, sql: str) -> list[tuple[Any, ...]]:
    assert app.store is not None
    rows: list[tuple[Any, ...]] = await app.store.read(lambda tx: tx.execute(sql).fetchall())  # type: ignore[attr-defined]
    return rows


async def run_episode(
    directory: Path,
    cause: Callable[[], Awaitable[None]],
    lift: Callable[[], None],
    *,
    every_write_refused: bool,
) -> None:
    gate = asyncio.Event()

    async def endpoint(rec: Recorded) -> tuple[int, Any]:
        await gate.wait()  # hold every answer until the disk is full
        return 200, {"ok": True}

    async with FakePeer(endpoint) as peer, SmtpSink() as sink:
        setup = write_master_config(directory, endpoint_url=peer.url + "mas", smtp_port=sink.port)
        app = App(load_config(setup.config))
        await app.start()
        try:
            async with httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT) as http:
                episode = Episode(setup, app, peer, sink, http, every_write_refused)
                await play(episode, gate, cause, lift)
        finally:
            gate.set()
            await app.stop()


async def play(
    ep: Episode, gate: asyncio.Event, cause: Callable[[], Awaitable[None]], lift: Callable[[], None]
) -> None:
    ep.sink.refuse("451 4.3.0 try later", count=REFUSED)  # the first acknowledgements, once
    before = [ep.handover(n, "ticket@help.example") for n in range(CASES)]
    before += [
        ep.handover(CASES + n, "ticket!callback@help.example", "phone: +1 555 0100\n")
        for n in range(CASES)
    ]
    await asyncio.gather(*(h.run() for h in before))
    assert all(h.replies == [] for h in before), "the store was healthy"
    await ep.peer.wait_for(CASES, WAIT)  # handoff.requests, held by the endpoint
    await wait_until(lambda: len(ep.sink.refused) == REFUSED, "the first acknowledgements refused")

    loop = asyncio.get_running_loop()
    began = loop.time()
    await cause()
    handing = [await ep.until_refused(2 * CASES)]
    store = ep.app.store
    assert store is not None
    if ep.every_write_refused:
        assert not store.health.writable
    during = [ep.handover(len(ep.handovers) + n, "ticket@help.example") for n in range(DURING)]
    handing += [asyncio.create_task(h.run()) for h in during]
    gate.set()  # the endpoint answers 200: masd cannot record it
    first = {str(r.json["handoff_id"]): r for r in reversed(ep.peer.requests)}
    posting = [asyncio.create_task(ep.post_status(r, 1, "running")) for r in first.values()]
    await asyncio.sleep(FAULT_SECONDS)
    health = await ep.http.get("/healthz")
    writable_during = await gauge(ep.http, "masd_store_writable")
    sent_during = sends(ep.peer, ep.sink)
    statuses_during = list(ep.replies)
    lift()
    lifted = loop.time()
    await asyncio.gather(*handing, *posting)
    await wait_until(lambda: store.health.writable, "writable again")
    healed = loop.time() - lifted
    await drained(ep)
    await check(ep, health, writable_during, sent_during, statuses_during, began, healed)


async def drained(ep: Episode) -> None:
    """Wait until every outbox row is done (bounded)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 60
    while (await recorded(ep.app, "SELECT count(*) FROM outbox WHERE state != 'done'"))[0][0]:
        assert loop.time() < until, "the outbox did not drain within 60 s"
        await asyncio.sleep(0.1)


async def check(
    ep: Episode,
    health: httpx.Response,
    writable_during: float,
    sent_during: dict[str, int],
    statuses_during: list[int],
    began: float,
    healed: float,
) -> None:
    # What the operator saw while the store could not commit: where every write fails,
    # /healthz and the gauge say so throughout; on a real full disk, as the last write went.
    if ep.every_write_refused or health.status_code != 200:
        assert health.status_code == 503
        assert health.json()["error"] == "store"
        assert "SQLITE_FULL" in health.json()["detail"]
        assert int(health.headers["retry-after"]) > 0
    assert writable_during in ((0.0,) if ep.every_write_refused else (0.0, 1.0))
    assert (await ep.http.get("/healthz")).json() == {"ok": True}
    assert await gauge(ep.http, "masd_store_writable") == 1.0
    refusals = times_each([r for h in ep.handovers for r in h.replies])
    assert set(refusals) == {"451 4.3.0"}, refusals  # LMTP: 451 4.3.0, nothing else
    assert set(statuses_during) <= {200, 503}, statuses_during
    if ep.every_write_refused:
        assert 503 in statuses_during

    # Deliveries: each handed-over mail recorded once; statuses likewise.
    ids = await recorded(ep.app, "SELECT message_id, count(*) FROM messages GROUP BY 1")
    stored = {str(mid): int(n) for mid, n in ids}
    wanted = [h.message_id for h in ep.handovers]
    lost = [m for m in wanted if m not in stored]
    twice = [m for m, n in stored.items() if n > 1]
    rows = await recorded(
        ep.app, "SELECT handoff_id, seq, count(*) FROM statuses WHERE source = 'mode' GROUP BY 1, 2"
    )
    statuses = {(str(h), int(s)): int(n) for h, s, n in rows}
    lost_statuses = [k for k in ep.acknowledged if k not in statuses]
    twice_statuses = [k for k, n in statuses.items() if n > 1]
    failed = await recorded(ep.app, "SELECT count(*) FROM outbox WHERE state = 'failed'")

    total = sends(ep.peer, ep.sink)
    most_during = max(sent_during.values())
    delivered = counts(
        "deliveries",
        sent=sum(h.attempts for h in ep.handovers),
        recorded=len(stored),
        repeated=len(twice),
        lost=len(lost),
        delays=[h.delay for h in ep.handovers],
    )
    print(
        f"\n{delivered}"
        f"\nstatus callbacks: acknowledged {len(ep.acknowledged)}, recorded {len(statuses)},"
        f" repeated {len(twice_statuses)}, lost {len(lost_statuses)};"
        f" HTTP answers {times_each([str(s) for s in ep.replies])}"
        f"\nLMTP refusals during the fault: {refusals};"
        f" writable again {healed:.2f} s after the disk was freed"
        f"\noutbound: {len(total)} messages, {sum(total.values())} sends;"
        f" most sends of one message while the store refused writes: {most_during}"
        f" (by then {sum(sent_during.values())} sends)"
    )
    assert lost == []
    assert twice == []
    assert lost_statuses == []
    assert twice_statuses == []
    assert failed == [(0,)]
    # docs/protocol.md §10 "never a storm": needs the outbox to keep an outcome the store refuses
    # and record it later instead of sending again (the outbox's "outcome kept until
    # recorded"); on an outbox without it this is the assertion that fails.
    assert most_during <= 2, f"resend storm while the store refused writes: {sent_during}"


@pytest.fixture(autouse=True)
def disarmed() -> Any:
    DiskFull.armed.clear()
    yield
    DiskFull.armed.clear()


def test_disk_full_episode_on_a_real_tmpfs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tmpfs(tmp_path / "mnt", "16m") as mnt:
        filler: list[Path] = []

        async def cause() -> None:
            filler.append(fill(mnt))

        def lift() -> None:
            filler[0].unlink()

        with caplog.at_level(logging.INFO, logger="masd.store"):
            asyncio.run(run_episode(mnt / "masd", cause, lift, every_write_refused=False))
        operator_saw(caplog)


def test_disk_full_episode_through_the_store_seam(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # masd serve opens its store through masd.app.open_store; the SQLite file, with the seam.
    monkeypatch.setattr(masd.app, "open_store", lambda database, **_: open_with_seam(database))

    async def cause() -> None:
        DiskFull.armed.set()

    with caplog.at_level(logging.INFO, logger="masd.store"):
        asyncio.run(
            run_episode(tmp_path / "masd", cause, DiskFull.armed.clear, every_write_refused=True)
        )
    operator_saw(caplog)


def operator_saw(caplog: pytest.LogCaptureFixture) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name == "masd.store"]
    assert any("cannot commit: database or disk is full" in line for line in lines), lines
    assert any("accepts writes again" in line for line in lines), lines
