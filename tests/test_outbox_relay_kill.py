"""A masd host killed with ``kill -9`` right after the relay's ``250``: the mail is not sent again.

The relay is a small SMTP server on loopback written here, so that it can say when it has
written its ``250`` for a message, and then hold the session: it reads nothing more from
it, so masd cannot depend on anything after that reply.  Once the ``250`` is out, the test
waits until the store shows the row done, kills the host, and lets the mail's queue be
taken up again: on SQLite by masd started again on the same file, on PostgreSQL by a
second host once ``claim_timeout`` (2 s) has run out.  A second mail (a second case) is
then acknowledged through the relay, answering normally now, and every outbox row is
done: the first acknowledgement reached the relay once.

On an idle store this passes whether the record is a transaction of its own right after
the ``250`` or waits behind the outbox's other records (the tree before that change passed
it too). The test that tells the two apart is, in ``tests/test_outbox.py``,
``test_a_mail_the_relay_took_is_recorded_at_once_not_behind_other_records``.

What remains (docs/operations.md §11, "each outbox row"): a host killed between the
relay's ``250`` and that commit (a round trip to the store) leaves the row pending, and it
is sent again with the same Message-ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.masd_process import MasdProcess, MasterSetup, mx_mail, write_master_config
from support.postgres import Database, postgres_server, two_hosts  # noqa: F401
from support.postgres import postgres as postgres

from masd.testing import lmtpclient
from masd.testing.wait import wait_until

pytestmark = [pytest.mark.fault]

WAIT = 60.0


class Relay:
    """An SMTP relay on loopback that records each message; while ``hold`` is set, it
    stops reading a session once it has written the ``250`` of a message's DATA."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.hold = True
        self.answered = asyncio.Event()  # a 250 for DATA written and drained
        self._server: asyncio.Server | None = None
        self._sessions: list[asyncio.StreamWriter] = []

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._sessions:
            writer.close()
        for writer in self._sessions:
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await self._server.wait_closed()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._sessions.append(writer)

        async def say(line: str) -> None:
            writer.write(line.encode() + b"\r\n")
            await writer.drain()

        try:
            await say("220 relay.test ESMTP")
            while line := await reader.readline():
                verb = line[:4].upper()
                if verb in (b"EHLO", b"HELO"):
                    await say("250-relay.test\r\n250 8BITMIME")
                elif verb == b"DATA":
                    await say("354 go ahead")
                    data = await reader.readuntil(b"\r\n.\r\n")
                    self.messages.append(data)
                    await say("250 2.0.0 queued")
                    if self.hold:
                        self.answered.set()
                        return  # the session is held: nothing more is read from it
                elif verb == b"QUIT":
                    await say("221 bye")
                    break
                else:  # MAIL, RCPT, RSET, NOOP
                    await say("250 ok")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        writer.close()

    def message_ids(self) -> list[str]:
        found = []
        for data in self.messages:
            for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
                if line.lower().startswith(b"message-id:"):
                    found.append(line.split(b":", 1)[1].strip().decode())
        return found


async def mail(setup: MasterSetup, n: int) -> None:
    sender, rcpt = f"user{n}@example.org", "ticket@help.example"
    _, data = mx_mail(sender, rcpt, subject=f"Mail {n}", body="Hello.\n")
    while True:  # as Postfix does: a temporary failure is tried again
        result = await lmtpclient.deliver(("127.0.0.1", setup.lmtp_port), sender, [rcpt], data)
        if result.codes == (250,):
            return
        await asyncio.sleep(0.5)


def sqlite_rows(path: Path) -> Callable[[], list[tuple[Any, ...]]]:
    def rows() -> list[tuple[Any, ...]]:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return db.execute("SELECT id, state FROM outbox ORDER BY id").fetchall()
        finally:
            db.close()

    return rows


def pg_rows(db: Database) -> Callable[[], list[tuple[Any, ...]]]:
    def rows() -> list[tuple[Any, ...]]:
        with psycopg.connect(db.uri, password=db.password) as conn:
            return conn.execute("SELECT id, state FROM outbox ORDER BY id").fetchall()

    return rows


async def kill_after_the_250(
    relay: Relay,
    first: MasterSetup,
    host: MasdProcess,
    rows: Callable[[], list[tuple[Any, ...]]],
) -> None:
    """One acknowledged mail; the host killed once the relay's 250 is out and recorded."""
    await mail(first, 1)
    await asyncio.wait_for(relay.answered.wait(), WAIT)
    await wait_until(lambda: rows() == [(1, "done")], "the relay's 250 recorded", WAIT)
    host.kill()  # kill -9, the relay session still held open


async def the_queue_goes_on(
    relay: Relay, setup: MasterSetup, rows: Callable[[], list[tuple[Any, ...]]]
) -> None:
    relay.hold = False
    await mail(setup, 2)
    await wait_until(lambda: len(relay.messages) >= 2, "the second acknowledgement", WAIT)
    # Every row done: a first row left pending would be sent again before this holds.
    await wait_until(
        lambda: [state for _, state in rows()] == ["done", "done"], "every row done", WAIT
    )
    ids = relay.message_ids()
    print(f"\nacknowledgements at the relay: {ids}")
    assert len(ids) == 2, ids
    assert len(set(ids)) == 2, f"an acknowledgement was sent twice: {ids}"


def test_sqlite_a_host_killed_after_the_relays_250_does_not_send_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Relay() as relay:
            setup = write_master_config(
                tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=relay.port
            )
            rows = sqlite_rows(tmp_path / "masd.db")
            host = MasdProcess(setup.config, tmp_path / "masd.log")
            async with host:
                await kill_after_the_250(relay, setup, host, rows)
                await host.start()  # the same store, as systemd restarts it
                await the_queue_goes_on(relay, setup, rows)

    asyncio.run(scenario())


def test_postgresql_a_host_killed_after_the_relays_250_is_not_sent_again_by_another(
    tmp_path: Path, postgres: Database
) -> None:
    async def scenario() -> None:
        async with Relay() as relay:
            a, b = hosts(tmp_path, postgres, relay.port)
            rows = pg_rows(postgres)
            host_a = MasdProcess(a.config, tmp_path / "a.log")
            host_b = MasdProcess(b.config, tmp_path / "b.log")
            async with host_a:
                await kill_after_the_250(relay, a, host_a, rows)
            async with host_b:  # a row A still held would be B's after claim_timeout
                await the_queue_goes_on(relay, b, rows)

    asyncio.run(scenario())


def hosts(directory: Path, db: Database, smtp_port: int) -> tuple[MasterSetup, MasterSetup]:
    return two_hosts(
        directory,
        db,
        endpoint_url="http://127.0.0.1:9/mas",
        smtp_port=smtp_port,
        server_lines='claim_timeout = "2s"\n',
    )
