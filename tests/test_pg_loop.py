"""Store jobs as jobs of the event loop (masd.store.pg_loop), and the connections they are lent
(masd.store.pg_conns): real sockets, a real PostgreSQL server, no fakes."""

from __future__ import annotations

import asyncio
import contextvars
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.store import StoreError
from masd.store.pg_backend import PgStore
from masd.store.pg_conns import Connections
from masd.store.pg_loop import spawn, suspend, wait_socket
from masd.store.sql import Tx, send, value

# -- jobs that suspend --------------------------------------------------------------


def test_a_job_waits_on_the_loop_while_the_loop_serves_others() -> None:
    """Two jobs, each waiting for what the other does: they finish only if neither holds the
    loop while it waits."""

    async def main() -> list[str]:
        said: list[str] = []
        a_went, b_went = asyncio.Event(), asyncio.Event()

        def job(name: str, mine: asyncio.Event, theirs: asyncio.Event) -> str:
            mine.set()
            suspend(theirs.wait())
            said.append(name)
            return name.upper()

        done = await asyncio.gather(
            spawn(job, "a", a_went, b_went), spawn(job, "b", b_went, a_went)
        )
        assert list(done) == ["A", "B"]
        return said

    assert sorted(asyncio.run(main())) == ["a", "b"]


def test_suspend_outside_a_job_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="outside a job"):
            suspend(asyncio.sleep(0))

    asyncio.run(main())


def test_what_the_awaited_raises_is_raised_where_the_job_waited() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def fails() -> None:
            raise LookupError("from the loop")

        def job() -> None:
            try:
                suspend(fails())
            except LookupError as exc:
                seen.append(str(exc))
                raise ValueError("the job's own") from exc

        with pytest.raises(ValueError, match="the job's own"):
            await spawn(job)
        return seen

    assert asyncio.run(main()) == ["from the loop"]


def test_a_cancelled_job_undoes_its_work_and_may_wait_while_it_does() -> None:
    async def main() -> list[str]:
        steps: list[str] = []

        def job() -> None:
            try:
                suspend(asyncio.sleep(30))
            finally:
                steps.append("undoing")
                suspend(asyncio.sleep(0))  # a ROLLBACK's round trip
                steps.append("undone")

        task = asyncio.ensure_future(spawn(job))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return steps

    assert asyncio.run(main()) == ["undoing", "undone"]


def test_a_job_sees_its_callers_context_and_keeps_its_own() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> tuple[str, str]:
        var.set("caller's")

        def job() -> str:
            seen = var.get()
            var.set("job's")
            suspend(asyncio.sleep(0))
            assert var.get() == "job's"
            return seen

        return await spawn(job), var.get()

    assert asyncio.run(main()) == ("caller's", "caller's")


def test_wait_socket_returns_once_the_socket_is_readable() -> None:
    left, right = socket.socketpair()
    with left, right:

        async def main() -> bytes:
            def job() -> bytes:
                wait_socket(left.fileno(), select.POLLIN)
                return left.recv(10)

            waiting = asyncio.ensure_future(spawn(job))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            right.send(b"ready")
            return await waiting

        assert asyncio.run(main()) == b"ready"


# -- the connections ----------------------------------------------------------------


@pytest.fixture
def opener(postgres: Database) -> Iterator[Any]:  # noqa: F811
    opened: list[psycopg.Connection[Any]] = []

    def open_one() -> psycopg.Connection[Any]:
        conn = psycopg.Connection.connect(postgres.socket_uri, autocommit=True)
        opened.append(conn)
        return conn

    open_one.opened = opened  # type: ignore[attr-defined]
    yield open_one
    for conn in opened:
        conn.close()


def test_connections_are_lent_up_to_the_limit_then_waited_for(opener: Any) -> None:
    conns = Connections(opener, 2, timeout=0.2, label="test")

    async def main() -> None:
        (a, _), (b, _) = await conns.get(), await conns.get()
        assert a is not b
        third = asyncio.ensure_future(conns.get())
        await asyncio.sleep(0.05)
        assert not third.done()  # the limit: it waits
        conns.put(a)
        assert (await third)[0] is a
        with pytest.raises(
            psycopg.OperationalError, match=r"no connection of 2 free within 0\.2 s"
        ):
            await conns.get()
        conns.put(b)
        conns.put(a)
        again, idle = await conns.get()
        assert again is a  # the one given back last
        assert idle >= 0
        conns.put(again)

    asyncio.run(main())
    assert len(opener.opened) == 2
    conns.close()
    assert all(c.closed for c in opener.opened)


def test_a_connection_opened_for_a_borrower_that_gave_up_is_closed(opener: Any) -> None:
    conns = Connections(opener, 1, timeout=5, label="test")

    async def main() -> None:
        borrowing = asyncio.ensure_future(conns.get())
        await asyncio.sleep(0)  # the opening has begun on the executor
        borrowing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await borrowing
        for _ in range(200):
            if opener.opened and all(c.closed for c in opener.opened):
                break
            await asyncio.sleep(0.01)
        assert len(opener.opened) == 1
        assert opener.opened[0].closed
        conn, _ = await conns.get()  # its place is free again
        conns.put(conn)

    asyncio.run(main())
    conns.close()


async def _lent_and_waited_for(
    conns: Connections,
) -> tuple[psycopg.Connection[Any], asyncio.Future[tuple[psycopg.Connection[Any], float]]]:
    """The one connection of ``conns`` lent, and a second borrower waiting for it."""
    conn, _ = await conns.get()
    waiting = asyncio.ensure_future(conns.get())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    return conn, waiting


def test_a_connection_given_back_broken_is_closed_and_its_place_reopened(opener: Any) -> None:
    conns = Connections(opener, 1, timeout=5, label="test")

    async def main() -> None:
        conn, waiting = await _lent_and_waited_for(conns)
        conn.pgconn.enter_pipeline_mode()  # not idle on the server: not kept
        conns.put(conn)
        fresh, _ = await waiting
        assert conn.closed
        assert fresh is not conn
        assert not fresh.closed
        conns.put(fresh)

    asyncio.run(main())
    conns.close()


def test_a_connection_given_back_on_another_thread_reaches_a_waiter(opener: Any) -> None:
    conns = Connections(opener, 1, timeout=5, label="test")

    async def main() -> None:
        conn, waiting = await _lent_and_waited_for(conns)
        threading.Thread(target=conns.put, args=(conn,)).start()
        assert (await waiting)[0] is conn
        conns.put(conn)

    asyncio.run(main())
    conns.close()


# -- the store's jobs on the loop ---------------------------------------------------


@pytest.fixture
def store(postgres: Database) -> Iterator[PgStore]:  # noqa: F811
    with PgStore(postgres.socket_uri) as s:
        s.write_sync(lambda tx: send(tx, "CREATE TABLE t (k BIGINT PRIMARY KEY)"))
        yield s


def test_write_jobs_on_one_loop_run_side_by_side(store: PgStore) -> None:
    """The first job waits (in its transaction) for a row the second commits: it sees it only
    if the second ran while the first waited."""

    def first(tx: Tx) -> int:
        for _ in range(500):
            found = int(value(tx, "SELECT count(*) FROM t WHERE k = 2"))
            if found:
                return found
            value(tx, "SELECT pg_sleep(0.01)")
        return 0

    def second(tx: Tx) -> None:
        send(tx, "INSERT INTO t (k) VALUES (2)")

    async def main() -> list[Any]:
        waiting = asyncio.ensure_future(store.write(first))
        await asyncio.sleep(0.05)
        return list(await asyncio.gather(waiting, store.write(second)))

    assert asyncio.run(main()) == [1, None]


def test_a_write_whose_caller_stopped_waiting_still_commits(store: PgStore) -> None:
    def slow(tx: Tx) -> None:
        value(tx, "SELECT pg_sleep(0.2)")
        send(tx, "INSERT INTO t (k) VALUES (7)")

    async def main() -> None:
        caller = asyncio.ensure_future(store.write(slow))
        await asyncio.sleep(0.05)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(100):
            if await store.read(lambda tx: value(tx, "SELECT count(*) FROM t")):
                return
            await asyncio.sleep(0.02)

    asyncio.run(main())
    assert store.read_sync(lambda tx: value(tx, "SELECT count(*) FROM t WHERE k = 7")) == 1


def test_a_closed_store_refuses_jobs(postgres: Database) -> None:  # noqa: F811
    store = PgStore(postgres.socket_uri)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.write_sync(lambda tx: value(tx, "SELECT 1"))
