"""A queue's next head is never left unsent for a look when two hosts race on it (PostgreSQL).

One host records that the relay took the last pending row of a queue (``relayed``) while
another queues a row behind it (``queue_item``).  Either the record says a row is behind
(the sender looks for it), or the new row is its queue's head, leased to the host that
queued it (which sends it without a look): never neither, whichever commits first.  Each
test holds one transaction open at the racy point and shows the other one waiting for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.store import outbox
from masd.store.pg_admin import migrate as pg_migrate
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, value

T = TypeVar("T")

QUEUE = "intake:i-1|mode"
#: Seconds a job holds its transaction open for the other to run into it.
HOLD = 0.5


def _row(n: int) -> outbox.NewRow:
    return outbox.NewRow("mail", QUEUE, "relay", None, None, {"n": n})


@pytest.fixture
def hosts(postgres: Database) -> Iterator[tuple[PgStore, PgStore]]:  # noqa: F811
    pg_migrate(postgres.uri, postgres.password)
    with (
        PgStore(postgres.uri, password=postgres.password, host="a") as a,
        PgStore(postgres.uri, password=postgres.password, host="b") as b,
    ):
        yield a, b


class Held:
    """``job`` in a write of ``store`` on a thread of its own, its transaction kept open
    after ``job`` ran until :meth:`release`."""

    def __init__(self, store: PgStore, job: Callable[[Tx], Any]) -> None:
        self.ran, self.go = threading.Event(), threading.Event()
        self.result: Any = None
        self._job, self._store = job, store
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self.ran.wait(10), "the held job did not run"

    def _run(self) -> None:
        def job(tx: Tx) -> Any:
            got = self._job(tx)
            self.ran.set()
            self.go.wait(10)
            return got

        self.result = self._store.write_sync(job)

    def release(self) -> Any:
        self.go.set()
        self._thread.join(10)
        return self.result


class Timed:
    """``job`` in a write of ``store`` on a thread of its own, and when it ended."""

    def __init__(self, store: PgStore, job: Callable[[Tx], Any]) -> None:
        self.result: Any = None
        self.ended = 0.0
        self._thread = threading.Thread(target=self._run, args=(store, job), daemon=True)
        self._thread.start()

    def _run(self, store: PgStore, job: Callable[[Tx], Any]) -> None:
        self.result = store.write_sync(job)
        self.ended = time.monotonic()

    def join(self) -> Any:
        self._thread.join(10)
        return self.result


def _run_now(answer: T, tx: Tx) -> T:
    """``answer``, once the statements the job sent so far ran (a read waits for them all;
    ``relayed`` reads its own results only with the commit)."""
    assert value(tx, "SELECT 1") == 1
    return answer


def _head(a: PgStore) -> int:
    item, head = a.write_sync(lambda tx: outbox.queue_item(tx, _row(1), time.time(), 1e12))
    assert (head, item.held_until > 0) == (True, True)
    return item.id


def test_a_row_queued_while_the_head_is_recorded_sent_becomes_the_head(
    hosts: tuple[PgStore, PgStore],
) -> None:
    a, b = hosts
    first = _head(a)
    record = Held(a, lambda tx: _run_now(outbox.relayed(tx, first, time.time()), tx))
    queued = Timed(b, lambda tx: outbox.queue_item(tx, _row(2), time.time(), 1e12))
    time.sleep(HOLD)
    released = time.monotonic()
    assert record.release()() == (True, False)  # nothing behind it as of its commit
    item, head = queued.join()
    assert queued.ended >= released  # it waited for the record's commit
    assert (head, item.held_until > 0) == (True, True)  # the head, host b's to send


def test_a_record_after_a_row_queued_behind_it_sees_that_row(
    hosts: tuple[PgStore, PgStore],
) -> None:
    a, b = hosts
    first = _head(a)
    queued = Held(b, lambda tx: outbox.queue_item(tx, _row(2), time.time(), 1e12))
    record = Timed(a, lambda tx: outbox.relayed(tx, first, time.time()))
    time.sleep(HOLD)
    released = time.monotonic()
    item, head = queued.release()
    assert (head, item.held_until) == (False, 0)  # behind the pending head: nobody's yet
    assert record.join()() == (True, True)  # its sender looks for the row behind it
    assert record.ended >= released
