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

from masd.store import StoreError, pg_pipeline
from masd.store.pg_backend import PgStore
from masd.store.pg_pipeline import Transaction
from masd.store.sql import Tx, one, rerun, run, savepoint, send, tuples, value


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


def test_a_read_is_one_snapshot_and_writes_nothing(store: PgStore, postgres: Database) -> None:  # noqa: F811
    def read(tx: Tx) -> tuple[int, int]:
        before = int(value(tx, "SELECT count(*) FROM t"))
        with psycopg.connect(postgres.socket_uri, autocommit=True) as other:
            other.execute("INSERT INTO t (k) VALUES (1)")  # committed now
        return before, int(value(tx, "SELECT count(*) FROM t"))

    assert store.read_sync(read) == (0, 0)
    assert _count(store) == 1
    with pytest.raises(StoreError, match="25006"):
        store.read_sync(lambda tx: run(tx, "DELETE FROM t"))
    assert _count(store) == 1


# -- statements prepared once per connection ---------------------------------------------


@pytest.fixture
def conn(postgres: Database) -> Iterator[psycopg.Connection[Any]]:  # noqa: F811
    with psycopg.connect(postgres.socket_uri, autocommit=True, prepare_threshold=None) as c:
        c.execute("CREATE TABLE p (k BIGINT PRIMARY KEY, v TEXT)")
        yield c


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'masd_%' ORDER BY name"
    ).fetchall()
    return [r[0] for r in rows]


def _select(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] = ()) -> Any:
    with Transaction(conn, "BEGIN") as pipe:
        row = pipe.execute(sql, params).fetchone()
        pipe.commit()
    return row[0] if row else None


def test_a_statement_is_prepared_once_per_connection_and_parameter_types(
    conn: psycopg.Connection[Any],
) -> None:
    sql = "SELECT ? + 1"
    assert [_select(conn, sql, (n,)) for n in (1, 2, 3)] == [2, 3, 4]
    assert _prepared(conn) == ["SELECT $1 + 1"]
    # psycopg dumps a larger int as another type: another statement, the right answer
    assert _select(conn, sql, (2**40,)) == 2**40 + 1
    assert _select(conn, sql, (5,)) == 6
    assert len(_prepared(conn)) == 2


def test_a_parse_skipped_by_an_aborted_pipeline_is_made_again(
    conn: psycopg.Connection[Any],
) -> None:
    with Transaction(conn, "BEGIN") as pipe:
        pipe.execute("SELECT 1 / ?", (0,))  # not read: its error aborts what follows
        second = pipe.execute("SELECT ? || 'x'", ("a",))
        with pytest.raises(psycopg.errors.DivisionByZero):
            second.fetchone()
    assert _prepared(conn) == ["SELECT 1 / $1"]  # the second Parse was skipped
    assert _select(conn, "SELECT ? || 'x'", ("a",)) == "ax"


def test_what_a_rolled_back_transaction_prepared_is_used_after_it(
    conn: psycopg.Connection[Any],
) -> None:
    insert = "INSERT INTO p (k, v) VALUES (?, ?)"
    with Transaction(conn, "BEGIN") as pipe:
        assert pipe.execute(insert, (1, "a")).rowcount == 1  # then rolled back
    with Transaction(conn, "BEGIN") as pipe:
        assert pipe.execute(insert, (1, "b")).rowcount == 1
        pipe.commit()
    assert conn.execute("SELECT v FROM p").fetchall() == [("b",)]
    assert _prepared(conn) == ["INSERT INTO p (k, v) VALUES ($1, $2)"]


def test_past_the_limit_the_statement_least_recently_run_is_dropped(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_pipeline, "MAX_PREPARED", 3)
    texts = [f"SELECT ?::int + {n}" for n in range(5)]
    assert [_select(conn, t, (1,)) for t in texts[:3]] == [1, 2, 3]
    assert _select(conn, texts[0], (1,)) == 1  # run again: the most recent now
    assert [_select(conn, t, (1,)) for t in texts[3:]] == [4, 5]  # drop 1, then 2
    assert _prepared(conn) == ["SELECT $1::int + 0", "SELECT $1::int + 3", "SELECT $1::int + 4"]
    with Transaction(conn, "BEGIN") as pipe:  # one transaction over the limit: in order
        results = [pipe.execute(t, (1,)) for t in texts]
        assert [r.fetchone() for r in results] == [(n + 1,) for n in range(5)]
        pipe.commit()
    assert len(_prepared(conn)) == 3


def test_statements_the_server_dropped_are_made_anew_and_the_job_runs_again(
    postgres: Database,  # noqa: F811
) -> None:
    with PgStore(postgres.socket_uri) as s:
        s.write_sync(lambda tx: send(tx, "CREATE TABLE q (k BIGINT PRIMARY KEY, v TEXT)"))
        s.write_sync(lambda tx: send(tx, "INSERT INTO q (k, v) VALUES (?, ?)", (1, "a")))
        everything = "SELECT * FROM q WHERE k = ?"
        assert s.read_sync(lambda tx: tuples(tx, everything, (1,))) == [(1, "a")]
        # a migration elsewhere: the prepared SELECT * now returns another row type (0A000)
        s.write_sync(lambda tx: send(tx, "ALTER TABLE q ADD COLUMN w TEXT DEFAULT 'w'"))
        assert s.read_sync(lambda tx: tuples(tx, everything, (1,))) == [(1, "a", "w")]

        def dropped(tx: Tx) -> int:
            count = "SELECT count(*) FROM q WHERE k = ?"
            value(tx, count, (1,))
            if not rerun(tx):
                send(tx, "DEALLOCATE ALL")  # a pooler's DISCARD ALL: the statements are gone
            return int(value(tx, count, (1,)))  # 26000 in the first run

        before = s.conflicts
        assert s.write_sync(dropped) == 1
        assert s.conflicts == before + 1
