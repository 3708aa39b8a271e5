"""masd serving on PostgreSQL: the store several hosts share, run in this process on loopback.

:class:`masd.app.App` runs with ``server.database`` a ``postgresql://`` URI on the private
test server (TCP, its password in ``server.database_password_file``).  Mail goes in over
LMTP, cases are read back by ``masd case list`` and checked by ``masd doctor``'s store
check, all through the same database.  Then the database goes down mid-run (a private
server of the test's own, stopped and started again): LMTP answers ``451 4.3.0``, HTTP
``503``, ``/healthz`` 503, and masd recovers with no restart once the server is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from support.masd_process import MasterSetup, mx_mail, wait_until, write_master_config
from support.postgres import Database, postgres_server  # noqa: F401
from support.postgres import postgres as postgres
from support.system import missing

from masd.app import App
from masd.cli import main
from masd.config import load_config
from masd.ops.doctor import check_store
from masd.store import outbox
from masd.store.pg_backend import CONNECT_TIMEOUT, PgStore
from masd.store.sql import Tx, tuples
from masd.testing import FakePeer, Recorded, SmtpSink, lmtpclient
from masd.testing.postgres import PostgresServer, find_bindir

RCPT = "ticket@help.example"
WAIT = 20.0


def on_postgres(
    directory: Path, uri: str, password: str, peer: FakePeer, sink: SmtpSink, extra: str = ""
) -> MasterSetup:
    """A master-role configuration whose store is the PostgreSQL database ``uri``."""
    setup = write_master_config(directory, endpoint_url=peer.url + "mas", smtp_port=sink.port)
    secret = directory / "secrets" / "database.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    text = setup.config.read_text()
    assert 'database = "masd.db"\n' in text
    setup.config.write_text(
        text.replace(
            'database = "masd.db"\n',
            f'database = "{uri}"\ndatabase_password_file = "secrets/database.password"\n' + extra,
        )
    )
    return setup


@asynccontextmanager
async def serving(
    directory: Path, uri: str, password: str, peer: FakePeer | None = None, extra: str = ""
) -> AsyncIterator[tuple[App, MasterSetup]]:
    async with peer or FakePeer() as peer, SmtpSink() as sink:
        setup = on_postgres(directory, uri, password, peer, sink, extra)
        app = App(load_config(setup.config))
        await app.start()
        try:
            yield app, setup
        finally:
            await app.stop()


async def hand_over(setup: MasterSetup, n: int) -> lmtpclient.LmtpResult:
    sender = f"user{n}@example.org"
    _, data = mx_mail(sender, RCPT, subject=f"Mail {n}", body="Hello.\n")
    return await lmtpclient.deliver(("127.0.0.1", setup.lmtp_port), sender, [RCPT], data)


@pytest.mark.slow
def test_masd_serves_reads_and_checks_a_postgresql_store(
    tmp_path: Path, postgres: Database
) -> None:
    async def scenario() -> MasterSetup:
        async with serving(tmp_path, postgres.uri, postgres.password) as (app, setup):
            sender = "ann@example.org"
            _, data = mx_mail(sender, RCPT, subject="Hello", body="Hello.\n")
            target = ("127.0.0.1", setup.lmtp_port)
            first = await lmtpclient.deliver(target, sender, [RCPT], data)
            again = await lmtpclient.deliver(target, sender, [RCPT], data)  # Postfix retrying
            assert first.codes == (250,), first
            assert again.codes == (250,), again
            assert app.store is not None
            counted = await app.store.read(
                lambda tx: tx.execute("SELECT count(*) FROM messages").fetchone()  # type: ignore[attr-defined]
            )
            assert counted[0] == 1  # the retry was recognised: recorded once
            async with httpx.AsyncClient(base_url=setup.http_url) as http:
                assert (await http.get("/healthz")).status_code == 200
        return setup

    setup = asyncio.run(scenario())
    listed = CliRunner().invoke(main, ["case", "list", "--config", str(setup.config)])
    assert listed.exit_code == 0, listed.output
    assert "ticket=ticket-1@help.example  master  ann@example.org" in listed.output
    findings = check_store(load_config(setup.config), 10)
    assert findings[0].ok, findings
    assert findings[0].why.endswith("is writable")
    print(f"\ncase list on PostgreSQL:\n{listed.output}doctor: {findings[0].why}")


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A private server of this test's own, to stop and start while masd runs."""
    bindir = find_bindir()
    if bindir is None:
        missing("PostgreSQL", "postgresql")
    with PostgresServer(bindir) as server:
        yield server


@pytest.mark.fault
@pytest.mark.slow
def test_the_database_down_and_back_without_a_restart(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    server = own_server
    uri = server.create_database("masd")

    async def scenario() -> None:
        async with serving(tmp_path, uri, server.password) as (app, setup):
            assert (await hand_over(setup, 0)).codes == (250,)
            auth = {"Authorization": f"Bearer {setup.admin_token}"}
            async with httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT) as http:
                assert (await http.get("/mas/v0.1/cases", headers=auth)).status_code == 200
                await asyncio.to_thread(server.pause)
                loop = asyncio.get_running_loop()
                began = loop.time()
                refused = await hand_over(setup, 1)
                waited = loop.time() - began
                (result,) = refused.recipients
                reply = result.final
                assert (reply.code, reply.enhanced) == (451, "4.3.0"), refused
                cases = await http.get("/mas/v0.1/cases", headers=auth)
                assert cases.status_code == 503, cases.text
                assert cases.json()["error"] == "unavailable"
                assert "retry-after" in cases.headers
                health = await http.get("/healthz")
                assert health.status_code == 503, health.text
                print(
                    f"\ndown: LMTP {reply.code} {reply.enhanced} after {waited:.2f} s, HTTP 503, "
                    f"/healthz {health.text}"
                )
                # Postfix's session is not held: the wait is the pool's bound, not the
                # server's TCP timeouts (a bound of the configuration, not of speed).
                assert waited < 2 * CONNECT_TIMEOUT + 2, waited
                await asyncio.to_thread(server.resume)
                began = loop.time()

                async def healthy() -> bool:
                    return (await http.get("/healthz")).status_code == 200

                while not await healthy():
                    assert loop.time() - began < WAIT, "masd did not recover"
                    await asyncio.sleep(0.2)
                print(f"recovered {loop.time() - began:.2f} s after the server was back")
                assert (await hand_over(setup, 1)).codes == (250,)
                assert (await http.get("/mas/v0.1/cases", headers=auth)).status_code == 200
            assert app.store is not None
            await wait_until(
                lambda: app.store is not None and app.store.health.writable, "writable"
            )
            counted = await app.store.read(
                lambda tx: tx.execute("SELECT count(*) FROM messages").fetchone()  # type: ignore[attr-defined]
            )
            assert counted[0] == 2

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_send_longer_than_its_lease_is_never_taken_by_another_host(
    tmp_path: Path,
    postgres: Database,
) -> None:
    """``claim_timeout`` 1 s, an endpoint that takes 4 s to answer: the lease is renewed
    while the send lasts, so a second host trying to take the row all along never does."""
    lease, answer_after = 1.0, 4.0

    async def slow(_: Recorded) -> tuple[int, object]:
        await asyncio.sleep(answer_after)
        return 200, {"ok": True}

    async def scenario() -> None:
        peer = FakePeer(slow)
        extra = f'claim_timeout = "{lease:g}s"\n'
        async with serving(tmp_path, postgres.uri, postgres.password, peer, extra) as (app, setup):
            other = PgStore(postgres.uri, password=postgres.password, host="other-host")
            try:
                sender = "bob@example.org"
                rcpt = "ticket!callback@help.example"
                _, data = mx_mail(sender, rcpt, subject="Call me", body="phone: +1 555 0100\n")
                target = ("127.0.0.1", setup.lmtp_port)
                assert (await lmtpclient.deliver(target, sender, [rcpt], data)).codes == (250,)
                await peer.wait_for(1, WAIT)  # the handoff.request is being sent
                taken = await tries_to_take(other, answer_after + lease)
            finally:
                other.close()
            assert app.store is not None
            await wait_until(lambda: not app.outbox._in_flight, "the send ended")
        requests = [r.json["type"] for r in peer.requests]
        print(f"\nlease {lease:g} s, send {answer_after:g} s: taken by the other host {taken}")
        assert taken == []
        assert requests.count("handoff.request") == 1, requests

    asyncio.run(scenario())


async def tries_to_take(store: PgStore, seconds: float) -> list[int]:
    """Every outbox row ``store`` (another host) managed to claim within ``seconds``."""

    def take(tx: Tx) -> list[int]:
        pending = [int(r[0]) for r in tuples(tx, "SELECT id FROM outbox WHERE state = 'pending'")]
        return outbox.claim(tx, pending, "other-host", 30.0) if pending else []

    loop = asyncio.get_running_loop()
    until, taken = loop.time() + seconds, []
    while loop.time() < until:
        taken += await store.write(take)
        await asyncio.sleep(0.1)
    return taken
