"""The PostgreSQL backend against a private server: two stores on one database act as two hosts."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.core.engine import CaseView
from masd.store import StoreError, cases, outbox
from masd.store.backend import POSTGRESQL, SQLITE, Fault, Raced, numbered
from masd.store.pg_admin import migrate as pg_migrate
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, run, tuples, value
from masd.store.thread import append_thread
from masd.testing.net import free_port

# A table of the tests' own, beside masd's schema.
_DDL = (
    "CREATE TABLE tally (one BOOLEAN PRIMARY KEY, n BIGINT NOT NULL)",
    "INSERT INTO tally VALUES (TRUE, 0)",
)


@pytest.fixture
def hosts(postgres: Database) -> Iterator[tuple[PgStore, PgStore]]:  # noqa: F811
    """Two stores on one fresh database at masd's schema: two masd hosts."""
    server = postgres.socket_uri
    pg_migrate(server)
    with PgStore(server) as setup:

        def schema(tx: Tx) -> None:
            for statement in _DDL:
                run(tx, statement)

        setup.write_sync(schema)
    a, b = PgStore(server), PgStore(server)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _both(a: PgStore, b: PgStore, job: object, times: int) -> list[object]:
    """``job`` ``times`` times from each host at once; every result."""
    out: list[object] = []
    lock = threading.Lock()

    def host(store: PgStore) -> None:
        for _ in range(times):
            got = store.write_sync(job)  # type: ignore[arg-type]
            with lock:
                out.append(got)

    threads = [threading.Thread(target=host, args=(s,)) for s in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_case_ids_from_two_hosts_never_collide(hosts: tuple[PgStore, PgStore]) -> None:
    a, b = hosts
    numbers = _both(a, b, lambda tx: cases.next_number(tx, "example.org", "ticket"), 25)
    assert sorted(numbers) == list(range(1, 101))  # type: ignore[type-var]
    # A job that rolls back leaves its number unused (docs/protocol.md §2 on PostgreSQL).
    with pytest.raises(ZeroDivisionError):
        a.write_sync(lambda tx: [cases.next_number(tx, "example.org", "ticket"), 1 / 0])
    assert a.write_sync(lambda tx: cases.next_number(tx, "example.org", "ticket")) == 102


# The feed's cursor condition (masd.store.entries.events), on the thread alone.
_AFTER = (
    "SELECT pos FROM thread WHERE pos > ? AND xid < pg_snapshot_xmin(pg_current_snapshot()) "
    "ORDER BY pos LIMIT 1000"
)


def test_a_feed_reader_never_skips_an_entry(hosts: tuple[PgStore, PgStore]) -> None:
    """Writers on four cases (no case row shared) hold their transaction open a moment
    after taking a position; a reader following the feed by cursor still sees every one."""
    a, b = hosts
    keys = [f"k{n}" for n in range(4)]
    for key in keys:
        view = CaseView(key, f"{key}@x", "x", "t", key, "master", "")
        a.write_sync(lambda tx, v=view: cases.create(tx, v, 1.0))  # type: ignore[misc]
    done = threading.Event()
    seen: list[int] = []

    def writer(store: PgStore, key: str) -> None:
        def append(tx: Tx) -> None:
            append_thread(tx, key, "mail.in", {"n": 1}, at=2.0)
            time.sleep(random.uniform(0, 0.003))

        for _ in range(15):
            store.write_sync(append)

    def reader() -> None:
        cursor = 0
        while True:
            last = done.is_set()
            got = a.read_sync(lambda tx, c=cursor: [r[0] for r in tuples(tx, _AFTER, (c,))])
            seen.extend(got)
            cursor = max(got, default=cursor)
            if last:
                return

    threads = [
        threading.Thread(target=writer, args=(s, k))
        for s, k in zip((a, b, a, b), keys, strict=True)
    ]
    follow = threading.Thread(target=reader)
    follow.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    follow.join()
    stored = a.read_sync(lambda tx: [r[0] for r in tuples(tx, "SELECT pos FROM thread")])
    assert len(stored) == 60
    assert sorted(seen) == sorted(stored)


def test_a_lost_race_is_run_again_not_answered(hosts: tuple[PgStore, PgStore]) -> None:
    a, b = hosts

    def bump(tx: Tx) -> None:  # read, then write: what a job reads to change, it locks
        n = value(tx, "SELECT n FROM tally FOR UPDATE")
        if random.random() < 0.2:
            raise Raced("run me again")
        run(tx, "UPDATE tally SET n = ?", (n + 1,))

    _both(a, b, bump, 20)
    assert a.read_sync(lambda tx: value(tx, "SELECT n FROM tally")) == 80


def test_a_jobs_own_error_is_its_callers_alone(hosts: tuple[PgStore, PgStore]) -> None:
    a, _ = hosts
    with pytest.raises(StoreError, match=r"store job failed.*23505"):
        a.write_sync(lambda tx: run(tx, "INSERT INTO tally VALUES (TRUE, 1)"))
    assert a.health.writable
    assert a.read_sync(lambda tx: value(tx, "SELECT n FROM tally WHERE n >= ?", (0,))) == 0


def test_a_job_returning_a_cursor_is_refused(hosts: tuple[PgStore, PgStore]) -> None:
    a, _ = hosts
    with pytest.raises(StoreError, match="lazy"):
        a.write_sync(lambda tx: tx.execute("SELECT 1"))  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="lazy"):
        a.read_sync(lambda tx: tx.execute("SELECT 1"))  # type: ignore[attr-defined]


def test_a_server_that_is_not_there_is_unavailable(tmp_path: Path) -> None:
    uri = f"postgresql:///masd?host={tmp_path}&port={free_port()}&user=masd&connect_timeout=1"
    with PgStore(uri, size=1) as store:
        with pytest.raises(StoreError, match="write failed"):
            store.write_sync(lambda tx: value(tx, "SELECT 1"))
        assert not store.health.writable


@pytest.mark.parametrize(
    ("state", "fault"),
    [
        ("40001", Fault.CONFLICT),
        ("40P01", Fault.CONFLICT),
        ("08006", Fault.UNAVAILABLE),
        ("57P01", Fault.UNAVAILABLE),
        ("25006", Fault.UNAVAILABLE),
        ("53100", Fault.UNAVAILABLE),
        ("23505", None),
        ("42601", None),
    ],
)
def test_sqlstates_are_classified(state: str, fault: Fault | None) -> None:
    class Err(Exception):
        sqlstate = state

    assert POSTGRESQL.classify(Err()) is fault
    assert SQLITE.classify(Err()) is None


def test_placeholders_are_numbered_outside_quoted_text() -> None:
    sql = "SELECT '?', ? FROM t WHERE a LIKE 'x%' AND b = ?"
    assert numbered(sql) == (b"SELECT '?', $1 FROM t WHERE a LIKE 'x%' AND b = $2", 2)
    assert numbered("SELECT '?', \"a?\", ? FROM t WHERE v LIKE 'x%' AND k = ?") == (
        b"SELECT '?', \"a?\", $1 FROM t WHERE v LIKE 'x%' AND k = $2",
        2,
    )


def _terminate_others(store: PgStore) -> None:
    """Every other session on the database ended by the server (``57P01``)."""
    store.write_sync(
        lambda tx: tuples(
            tx,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
    )


def test_a_session_the_server_ends_is_unavailable_then_recovers(
    hosts: tuple[PgStore, PgStore],
) -> None:
    """A connection ended mid-job (``57P01``, as at a server's shutdown or fail-over) is the
    store's fault; an idle one ended meanwhile the pool replaces before use."""
    a, b = hosts

    def ended(tx: Tx) -> None:
        run(tx, "UPDATE tally SET n = n + 1")
        tuples(tx, "SELECT pg_terminate_backend(pg_backend_pid())")

    with pytest.raises(StoreError, match="write failed"):
        a.write_sync(ended)
    assert not a.health.writable
    _terminate_others(b)
    a.write_sync(lambda tx: run(tx, "UPDATE tally SET n = n + 10"))
    assert a.health.writable
    assert a.read_sync(lambda tx: value(tx, "SELECT n FROM tally")) == 10


def test_a_read_only_database_is_unavailable_not_the_jobs_fault(
    hosts: tuple[PgStore, PgStore],
) -> None:
    a, b = hosts
    name = b.read_sync(lambda tx: value(tx, "SELECT current_database()"))
    b.write_sync(
        lambda tx: run(tx, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    )
    _terminate_others(b)
    with pytest.raises(StoreError, match="25006"):
        a.write_sync(lambda tx: run(tx, "UPDATE tally SET n = n + 1"))
    assert not a.health.writable

    def writable_again(tx: Tx) -> None:
        run(tx, "SET TRANSACTION READ WRITE")
        run(tx, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')

    b.write_sync(writable_again)
    _terminate_others(b)
    a.write_sync(lambda tx: run(tx, "UPDATE tally SET n = n + 1"))
    assert a.health.writable


def test_a_job_run_again_logs_once_and_only_after_its_commit(
    hosts: tuple[PgStore, PgStore], caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = hosts
    runs: list[int] = []

    def job(tx: Tx) -> int:
        runs.append(len(runs))
        logging.getLogger("masd").info("status recorded run=%d", runs[-1])
        if len(runs) < 3:
            raise Raced("another writer took the key")
        return int(value(tx, "SELECT 1"))

    with caplog.at_level(logging.INFO, logger="masd"):
        assert a.write_sync(job) == 1
        logged = [r.getMessage() for r in caplog.records if r.name == "masd"]

        def refused(tx: Tx) -> None:
            logging.getLogger("masd").info("never committed")
            raise ValueError("the job's own error")

        with pytest.raises(ValueError, match="own error"):
            a.write_sync(refused)
    assert runs == [0, 1, 2]
    assert logged == ["status recorded run=2"]  # the run that committed, alone
    assert "never committed" not in caplog.text
    assert a.conflicts >= 2


def test_a_head_is_its_queuers_to_send_until_its_lease_runs_out(
    hosts: tuple[PgStore, PgStore],
) -> None:
    """A row queued as its queue's head is leased to the host that queued it, in the same
    statement: that host sends it without a claim; the other passes it by until the lease
    runs out (the host died), then takes it over."""
    a, b = hosts
    a.claim_seconds = 0.5
    view = CaseView("k1", "k1@example.org", "example.org", "ticket", "k1", "master", "a@b.c")
    a.write_sync(lambda tx: cases.create(tx, view, 10.0))

    def row(n: int) -> outbox.NewRow:
        return outbox.NewRow("contract", "q1", "peer", "k1", "http://x/", {"id": f"m{n}"})

    began = time.monotonic()
    first, head = a.write_sync(lambda tx: outbox.queue_item(tx, row(1), 1.0, 100.0))
    second, second_head = a.write_sync(lambda tx: outbox.queue_item(tx, row(2), 1.0, 100.0))
    assert (head, second_head) == (True, False)
    assert began < first.held_until <= time.monotonic() + a.claim_seconds / 3
    assert second.held_until == 0.0  # behind the head: claimed when it is the head

    def heads(store: PgStore) -> list[int]:
        return [i.id for i in store.read_sync(lambda tx: outbox.heads_of_queues(tx, ["q1"], 5.0))]

    assert heads(a) == [first.id]  # its own lease: its to send
    assert heads(b) == []
    assert b.write_sync(lambda tx: outbox.claim(tx, [first.id], b.host, 30.0)) == []
    time.sleep(a.claim_seconds + 0.1)  # a died: its lease runs out
    assert heads(b) == [first.id]
    assert b.write_sync(lambda tx: outbox.claim(tx, [first.id], b.host, 30.0)) == [first.id]
    assert heads(a) == []


def test_a_pooled_connection_is_pinged_only_after_it_was_idle(
    postgres: Database,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's connection is pinged only if it was idle :data:`CHECK_IDLE_SECONDS`; one
    the server dropped meanwhile fails its ping and is replaced, and the job runs."""
    from masd.store import pg_backend

    pings: list[int] = []
    ping = pg_backend.ping

    def counted(conn: psycopg.Connection[Any], wait: Any) -> None:
        pings.append(conn.info.backend_pid)
        ping(conn, wait)

    monkeypatch.setattr(pg_backend, "ping", counted)
    pid = "SELECT pg_backend_pid()"
    with PgStore(postgres.socket_uri) as store:
        first = {store.write_sync(lambda tx: value(tx, pid)) for _ in range(10)}
        assert pings == []  # new, then used a moment before: never pinged
        monkeypatch.setattr(pg_backend, "CHECK_IDLE_SECONDS", 0.0)
        assert {store.write_sync(lambda tx: value(tx, pid))} == first
        assert pings == list(first)  # idle "long enough": pinged, and kept
        with psycopg.connect(postgres.socket_uri, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", list(first))
        again = store.write_sync(lambda tx: value(tx, pid))
        assert pings == [*first, *first]  # its ping failed: the job ran on a new one
        assert again not in first
