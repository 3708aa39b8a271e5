"""Two masd hosts on one PostgreSQL database, in this process: the same input reaching both at once.

Each host is a :class:`masd.app.App` with the same configuration (domains, peers, secrets,
``public_url``) but its own LMTP and HTTP ports, on one database of the private test
server.  A mail delivered to both hosts at the same moment (Postfix on two MX hosts
retrying) is recorded once and both answer ``250``; a contract message with one
(peer, ``id``) posted to both at the same moment is processed once and both answer
with the same status and body.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.masd_process import MasterSetup, mx_mail
from support.postgres import Database, postgres_server  # noqa: F401
from support.postgres import postgres as postgres
from support.postgres import two_hosts as host_configs

from masd.app import App
from masd.config import load_config
from masd.store import StoreHandle
from masd.store.sql import tuples
from masd.testing import FakePeer, SmtpSink, lmtpclient

pytestmark = pytest.mark.slow

WAIT = 20.0
#: Mails (and statuses) sent to both hosts at once.
N = 8


def two_configs(directory: Path, db: Database, peer: FakePeer, sink: SmtpSink) -> list[MasterSetup]:
    """One configuration on ``db``, and a copy of it that differs in its listeners only."""
    return list(host_configs(directory, db, endpoint_url=peer.url + "mas", smtp_port=sink.port))


@asynccontextmanager
async def two_hosts(
    directory: Path, db: Database
) -> AsyncIterator[tuple[list[App], list[MasterSetup], FakePeer]]:
    async with FakePeer() as peer, SmtpSink() as sink, AsyncExitStack() as stack:
        setups = two_configs(directory, db, peer, sink)
        apps = []
        for setup in setups:
            app = App(load_config(setup.config))
            await app.start()
            stack.push_async_callback(app.stop)
            apps.append(app)
        yield apps, setups, peer


def store_of(app: App) -> StoreHandle:
    assert app.store is not None
    return app.store


async def count(app: App, sql: str) -> int:
    rows = await store_of(app).read(lambda tx: tuples(tx, sql))
    return int(rows[0][0])


def test_a_mail_delivered_to_two_hosts_at_once_is_recorded_once(
    tmp_path: Path, postgres: Database
) -> None:
    async def scenario() -> None:
        async with two_hosts(tmp_path, postgres) as (apps, setups, _):
            rcpt = "ticket@help.example"
            results = []
            for n in range(N):
                sender = f"user{n}@example.org"
                _, data = mx_mail(sender, rcpt, subject=f"Mail {n}", body="Hello.\n")
                results += await asyncio.gather(
                    *(
                        lmtpclient.deliver(("127.0.0.1", s.lmtp_port), sender, [rcpt], data)
                        for s in setups
                    )
                )
            codes = [r.codes for r in results]
            messages = await count(apps[0], "SELECT count(*) FROM messages")
            opened = await count(apps[1], "SELECT count(*) FROM cases")
            conflicts = sum(getattr(app.store, "conflicts", 0) for app in apps)
            print(
                f"\n{N} mails, each to both hosts at once: replies {set(codes)}, "
                f"recorded {messages}, cases {opened}, runs repeated after a conflict {conflicts}"
            )
            assert codes == [(250,)] * (2 * N)
            assert messages == N
            assert opened == N

    asyncio.run(scenario())


def status_of(request: Any, n: int) -> dict[str, Any]:
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": f"status-{n}-{secrets.token_hex(8)}",
        "case": request.json["case"],
        "handoff_id": request.json["handoff_id"],
        "seq": 1,
        "status": "running",
    }


def test_one_peer_and_id_posted_to_two_hosts_at_once_is_processed_once(
    tmp_path: Path, postgres: Database
) -> None:
    async def scenario() -> None:
        async with two_hosts(tmp_path, postgres) as (apps, setups, peer):
            rcpt = "ticket!callback@help.example"
            for n in range(N):
                sender = f"caller{n}@example.org"
                _, data = mx_mail(sender, rcpt, subject=f"Call {n}", body="phone: +1 555 0100\n")
                target = ("127.0.0.1", setups[n % 2].lmtp_port)
                assert (await lmtpclient.deliver(target, sender, [rcpt], data)).codes == (250,)
            requests = await peer.wait_for(N, WAIT)
            auth = {"Authorization": f"Bearer {setups[0].endpoint_token}"}
            answers = []
            async with httpx.AsyncClient(timeout=WAIT) as http:
                for n, request in enumerate(requests[:N]):
                    message = status_of(request, n)
                    answers.append(
                        await asyncio.gather(
                            *(http.post(s.messages_url, json=message, headers=auth) for s in setups)
                        )
                    )
            pairs = [((a.status_code, a.json()), (b.status_code, b.json())) for a, b in answers]
            statuses = await count(
                apps[0], "SELECT count(*) FROM statuses WHERE status = 'running'"
            )
            kept = await count(apps[1], "SELECT count(*) FROM idempotency")
            print(
                f"\n{N} statuses, each posted to both hosts at once: answers "
                f"{sorted({p[0][0] for p in pairs})}, recorded {statuses}, kept answers {kept}"
            )
            assert all(first == second for first, second in pairs), pairs
            assert {p[0][0] for p in pairs} == {200}
            assert statuses == N
            assert kept == N

    asyncio.run(scenario())
