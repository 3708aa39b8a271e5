"""A write job's libpq pipeline (masd.store.pg_pipeline) against a private server.

What a store job may rely on, whatever it sends before it reads: values come back as
psycopg's cursors give them, an error is raised at the next read or at the commit with its
own SQLSTATE, a savepoint undoes only its block, and a failed job leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.store import StoreError
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, one, run, savepoint, send, tuples, value


@pytest.fixture
def store(postgres: Database) -> Iterator[PgStore]:  # noqa: F811
    with PgStore(postgres.socket_uri) as s:
        s.write_sync(
            lambda tx: send(
                tx, "CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT, b BYTEA, f DOUBLE PRECISION)"
            )
        )
        yield s


def _count(store: PgStore) -> int:
    return int(store.read_sync(lambda tx: value(tx, "SELECT count(*) FROM t")))


def test_values_come_back_as_psycopgs_cursors_give_them(store: PgStore) -> None:
    sql = (
        "SELECT ?::bigint AS i, ?::text AS s, ?::bytea AS b, ?::double precision AS f, "
        "?::boolean AS t, ?::numeric AS n, NULL AS z, '?' AS q, 'a%b' AS p, ? = ANY(?) AS a"
    )
    params: tuple[Any, ...] = (7, "é\u2028", b"\x00\xff", 1.5, True, Decimal("2.50"), 3, [1, 3])
    expected = (7, "é\u2028", b"\x00\xff", 1.5, True, Decimal("2.50"), None, "?", "a%b", True)

    def both(tx: Tx) -> tuple[Any, Any]:
        return tuples(tx, sql, params)[0], one(tx, sql, params)

    written, named = store.write_sync(both)
    read = store.read_sync(lambda tx: tuples(tx, sql, params)[0])  # psycopg's own cursor
    assert written == read == expected
    assert named == dict(zip("isbftnzqpa", expected, strict=True))


def test_too_few_parameters_are_refused_naming_both_counts(store: PgStore) -> None:
    with pytest.raises(StoreError, match="2 placeholders but 1 parameters"):
        store.write_sync(lambda tx: send(tx, "INSERT INTO t (k, v) VALUES (?, ?)", (1,)))
    assert _count(store) == 0


def test_an_unread_statements_error_is_raised_at_the_next_read_and_nothing_commits(
    store: PgStore,
) -> None:
    seen: list[int] = []

    def job(tx: Tx) -> None:
        send(tx, "INSERT INTO t (k) VALUES (1)")
        send(tx, "INSERT INTO t (k) VALUES (1)")  # its key taken: 23505, not read
        send(tx, "INSERT INTO t (k) VALUES (2)")  # aborted with the pipeline
        seen.append(int(value(tx, "SELECT count(*) FROM t")))

    with pytest.raises(StoreError, match=r"store job failed.*23505"):
        store.write_sync(job)
    assert seen == []  # the read raised: the job never saw a count
    assert _count(store) == 0
    assert store.write_sync(lambda tx: run(tx, "INSERT INTO t (k) VALUES (1)")) == 1  # reusable


def test_an_error_of_the_last_statement_is_raised_at_the_commit(store: PgStore) -> None:
    def job(tx: Tx) -> None:
        send(tx, "INSERT INTO t (k) VALUES (1)")
        send(tx, "INSERT INTO t (k) VALUES ('not a number')")

    with pytest.raises(StoreError, match="22P02"):
        store.write_sync(job)
    assert _count(store) == 0


def test_a_savepoint_undoes_its_block_alone(store: PgStore) -> None:
    def twin(tx: Tx) -> None:
        with savepoint(tx):
            send(tx, "INSERT INTO t (k, v) VALUES (2, 'undone')")
            send(tx, "INSERT INTO t (k, v) VALUES (1, 'a twin')")

    def python_error(tx: Tx) -> None:
        with savepoint(tx):
            send(tx, "INSERT INTO t (k, v) VALUES (3, 'undone too')")
            raise ZeroDivisionError

    def job(tx: Tx) -> list[tuple[Any, ...]]:
        send(tx, "INSERT INTO t (k, v) VALUES (1, 'kept')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            twin(tx)
        with pytest.raises(ZeroDivisionError):
            python_error(tx)
        with savepoint(tx):
            send(tx, "INSERT INTO t (k, v) VALUES (4, 'kept too')")
        return tuples(tx, "SELECT k, v FROM t ORDER BY k")

    expected = [(1, "kept"), (4, "kept too")]
    assert store.write_sync(job) == expected
    assert store.read_sync(lambda tx: tuples(tx, "SELECT k, v FROM t ORDER BY k")) == expected


def test_more_than_the_sockets_buffers_hold_is_sent_before_the_read(store: PgStore) -> None:
    big = "x" * 65_536  # 300 statements of 64 KiB: some 20 MB queued, never a read between

    def job(tx: Tx) -> int:
        for k in range(300):
            send(tx, "INSERT INTO t (k, v) VALUES (?, ?)", (k, big))
        return int(value(tx, "SELECT count(*) FROM t WHERE length(v) = ?", (len(big),)))

    assert store.write_sync(job) == 300


def test_a_python_error_inside_a_job_rolls_back_what_it_sent(store: PgStore) -> None:
    def job(tx: Tx) -> None:
        send(tx, "INSERT INTO t (k) VALUES (1)")
        raise LookupError("the job's own")

    with pytest.raises(LookupError, match="the job's own"):
        store.write_sync(job)
    assert _count(store) == 0
    assert store.write_sync(lambda tx: run(tx, "INSERT INTO t (k) VALUES (1)")) == 1


def test_a_read_is_one_snapshot_and_writes_nothing(store: PgStore) -> None:
    def read(tx: Tx) -> tuple[int, int]:
        before = int(value(tx, "SELECT count(*) FROM t"))
        store.write_sync(lambda w: send(w, "INSERT INTO t (k) VALUES (1)"))  # committed now
        return before, int(value(tx, "SELECT count(*) FROM t"))

    assert store.read_sync(read) == (0, 0)
    assert _count(store) == 1
    with pytest.raises(StoreError, match="25006"):
        store.read_sync(lambda tx: run(tx, "DELETE FROM t"))
    assert _count(store) == 1
