"""masd started on a read-only store: it serves, refuses writes, and recovers without a restart.

masd runs as a real process.  Its store is made read-only after a ``kill -9``
(which leaves the ``-wal`` and ``-shm`` files, as a crash does): by file
modes, or, as root (where modes stop no one; CI runs as root), by remounting
the tmpfs that holds it read-only.  masd is started again on it, then the
store is made writable again while masd runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from support.faults import IS_ROOT, counts, handover, remount, tmpfs
from support.masd_process import WAIT, MasdProcess, MasterSetup, write_master_config

from masd.testing import FakePeer, Recorded, SmtpSink

pytestmark = [pytest.mark.fault, pytest.mark.slow]


@contextlib.contextmanager
def store_directory(tmp_path: Path) -> Iterator[tuple[Path, Callable[[bool], None]]]:
    """Where masd's configuration and store go, and how to make the store read-only."""
    if IS_ROOT:
        with tmpfs(tmp_path / "mnt", "16m") as mnt:

            def by_mount(writable: bool) -> None:
                remount(mnt, "rw" if writable else "ro")

            try:
                yield mnt / "masd", by_mount
            finally:
                remount(mnt, "rw")
        return
    directory = tmp_path / "masd"

    def by_modes(writable: bool) -> None:
        for file in directory.glob("masd.db*"):
            file.chmod(0o600 if writable else 0o400)

    yield directory, by_modes


def status(setup: MasterSetup, request: Recorded) -> dict[str, object]:
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": secrets.token_hex(16),
        "case": request.json["case"],
        "handoff_id": request.json["handoff_id"],
        "seq": 1,
        "status": "running",
    }


async def gauge(http: httpx.AsyncClient, name: str) -> float:
    text = (await http.get("/metrics")).text
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])


def test_masd_started_on_a_read_only_store_recovers_once_it_is_writable(tmp_path: Path) -> None:
    async def main(directory: Path, writable: Callable[[bool], None]) -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            setup = write_master_config(
                directory, endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            masd = MasdProcess(setup.config, tmp_path / "masd.log")
            async with masd:
                await read_only_run(setup, masd, peer, sink, writable)
            log = masd.log()
            assert "cannot commit: attempt to write a readonly database" in log, log
            assert "accepts writes again after" in log, log

    with store_directory(tmp_path) as (directory, writable):
        asyncio.run(main(directory, writable))


async def read_only_run(
    setup: MasterSetup,
    masd: MasdProcess,
    peer: FakePeer,
    sink: SmtpSink,
    writable: Callable[[bool], None],
) -> None:
    lmtp = ("127.0.0.1", setup.lmtp_port)
    first = handover(lmtp, "ann@example.org", "ticket!callback@help.example", body="phone: 1\n")
    await first.run()
    (request,) = await peer.wait_for(1, WAIT)
    await sink.wait_for(1, WAIT)
    masd.kill()
    writable(False)
    await masd.start()  # ready, on a store it cannot write

    headers = {"Authorization": f"Bearer {setup.admin_token}"}
    async with httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT, headers=headers) as http:
        health = await http.get("/healthz")
        assert health.status_code == 503
        assert health.json()["error"] == "store"
        assert "readonly" in health.json()["detail"]
        assert int(health.headers["retry-after"]) > 0
        assert await gauge(http, "masd_store_writable") == 0.0
        case = await http.get(f"/mas/v0.1/cases/{quote('ticket=ticket-1@help.example')}")
        assert case.status_code == 200  # the read side still answers

        second = handover(lmtp, "bob@example.net", "ticket@help.example")
        handing = asyncio.create_task(second.run())  # as Postfix: again until 250
        while not second.replies:
            await asyncio.sleep(0.05)
        token = {"Authorization": f"Bearer {setup.endpoint_token}"}
        message = status(setup, request)
        refused = await http.post(setup.messages_url, json=message, headers=token)
        assert refused.status_code == 503
        assert refused.json()["error"] == "unavailable"
        assert int(refused.headers["retry-after"]) > 0

        writable(True)
        loop = asyncio.get_running_loop()
        restored = loop.time()
        while (await http.get("/healthz")).status_code != 200:
            assert loop.time() - restored < WAIT, "still unhealthy after the store was restored"
            await asyncio.sleep(0.1)
        healed = loop.time() - restored
        await handing
        assert set(second.replies) == {"451 4.3.0"}, second.replies
        accepted = await http.post(setup.messages_url, json=message, headers=token)
        assert accepted.status_code == 200, accepted.text
        assert await gauge(http, "masd_store_writable") == 1.0
        await sink.wait_for(2, WAIT)  # the second case's acknowledgement
    assert await masd.terminate() == 0

    db = sqlite3.connect(setup.config.with_name("masd.db"))
    try:
        ids = [r[0] for r in db.execute("SELECT message_id FROM messages")]
        statuses = db.execute("SELECT count(*) FROM statuses WHERE source = 'mode'").fetchone()
    finally:
        db.close()
    handovers = [first, second]
    wanted = [h.message_id for h in handovers]
    print(
        "\n"
        + counts(
            "read-only store",
            sent=sum(h.attempts for h in handovers),
            recorded=len(set(ids)),
            repeated=len(ids) - len(set(ids)),
            lost=len(set(wanted) - set(ids)),
            delays=[h.delay for h in handovers],
        )
        + f"; healthy {healed:.2f} s after the store was made writable; status callbacks"
        f" recorded {statuses[0]}"
    )
    assert sorted(ids) == sorted(wanted)
    assert statuses == (1,)
