"""The store's functions on each backend: the same calls, the same answers, SQLite and PostgreSQL.

``backend`` is parametrized over both; the PostgreSQL one runs on a private server with
the PostgreSQL schema migrated in, and is skipped (naming why) where the server or that
schema is missing, unless ``MASD_REQUIRE_SYSTEM_TESTS`` is set.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest
from support.postgres import postgres, postgres_server  # noqa: F401

from masd.core.engine import CaseView
from masd.core.errors import MasdError
from masd.store import (
    Store,
    StoreError,
    cases,
    entries,
    handoffs,
    idempotency,
    open_store,
    outbox,
    purge,
    queue_rows,
    reads,
)
from masd.store.handoffs import NewHandoff, NewStatus
from masd.store.outbox import NewRow
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, run, value
from masd.store.thread import append_thread

Backend = Store | PgStore


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        with Store.open(tmp_path / "masd.db") as store:
            yield store
        return
    try:
        importlib.import_module("masd.store.pg_admin")
    except ImportError:
        if os.environ.get("MASD_REQUIRE_SYSTEM_TESTS"):
            raise
        pytest.skip("the PostgreSQL schema (masd.store.pg_schema, pg_admin) is not in this tree")
    uri = request.getfixturevalue("postgres").socket_uri
    with open_store(uri) as store:  # migrates it
        assert isinstance(store, PgStore)
        yield store


def _view(key: str, domain: str = "example.org") -> CaseView:
    return CaseView(key, f"{key}@{domain}", domain, "ticket", key, "master", "Ann@Example.org")


def _w(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.write_sync(fn)


def _r(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.read_sync(fn)


def test_cases_ids_and_threads(backend: Backend) -> None:
    got = [_w(backend, lambda tx: cases.next_number(tx, "example.org", "ticket")) for _ in "abc"]
    assert got == [1, 2, 3]
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    row = _r(backend, lambda tx: cases.load(tx, "k1"))
    assert (row.address, row.open_handoff) == ("k1@example.org", None)
    assert _w(backend, lambda tx: cases.load(tx, "k1")) == row  # a write locks the row
    _w(backend, lambda tx: append_thread(tx, "k1", "mail.in", {"n": 1}, at=11.0))
    _w(backend, lambda tx: append_thread(tx, "k1", "mail.in", {"n": 2}, at=12.0))
    events = _r(backend, lambda tx: entries.events(tx, 0, 10))
    assert [(e.seq, json.loads(e.data)["n"]) for e in events] == [(1, 1), (2, 2)]
    assert _r(backend, entries.last_pos) == events[-1].pos
    assert [e.seq for e in _r(backend, lambda tx: entries.last_events(tx, 1, "k1"))] == [2]
    listed = _r(
        backend, lambda tx: entries.cases(tx, before=None, limit=5, participant="ann@example.org")
    )
    assert [c.key for c in listed] == ["k1"]
    assert [c["key"] for c in _r(backend, lambda tx: reads.latest_cases(tx, 5, None))] == ["k1"]


def test_a_thread_entry_is_one_statement_and_no_seq_is_given_twice(backend: Backend) -> None:
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    said: list[str] = []

    def counted(tx: Tx) -> None:
        sqlite = not isinstance(backend, PgStore)
        if sqlite:
            cast(Any, tx).conn.set_trace_callback(said.append)
        try:
            append_thread(tx, "k1", "mail.in", {"n": 1}, at=11.0)
        finally:
            if sqlite:
                cast(Any, tx).conn.set_trace_callback(None)

    _w(backend, counted)
    if not isinstance(backend, PgStore):
        # SQLite traces a statement again as each trigger program of it begins.
        assert len(set(said)) == 1, said  # the trigger keeps cases.thread_seq (migration 8)
        assert said[0].startswith("INSERT INTO thread"), said
        with pytest.raises(MasdError, match="no case 'k2'") as refused:
            _w(backend, lambda tx: append_thread(tx, "k2", "mail.in", {}, at=11.0))
        assert refused.value.code == "unknown-case"
    # An entry written with a seq of its own (a copied store, an erased case's last entry):
    # the case's counter follows a higher one and never goes back for a lower one.
    insert = (
        "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?, ?, 'status', 12.0, '{}')"
    )
    _w(backend, lambda tx: run(tx, insert, ("k1", 5)))
    if not isinstance(backend, PgStore):  # PostgreSQL's entries are only ever appended
        _w(backend, lambda tx: run(tx, insert, ("k1", 3)))
        _w(backend, lambda tx: append_thread(tx, "k1", "mail.in", {"n": 6}, at=13.0))
        seqs = _r(backend, lambda tx: [e.seq for e in entries.last_events(tx, 5, "k1")])
        assert sorted(seqs) == [1, 3, 5, 6]


def test_handoffs_and_deadlines(backend: Backend) -> None:
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    h = NewHandoff("h1", "k1", "support", "peer", 50.0, False, None, {})
    _w(backend, lambda tx: handoffs.open_handoff(tx, h, 20.0))
    assert _r(backend, lambda tx: cases.load(tx, "k1")).open_handoff.handoff_id == "h1"
    assert _r(backend, lambda tx: handoffs.due(tx, 60.0)) == ["h1"]
    assert _r(backend, lambda tx: handoffs.next_deadline(tx, ["h1"])) is None
    assert [r["handoff_id"] for r in _r(backend, reads.open_handoffs)] == ["h1"]


def test_outbox_heads_and_queue(backend: Backend) -> None:
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    rows = [
        NewRow("contract", "q1", "peer", "k1", "http://x/", {"type": "t", "id": f"m{n}"})
        for n in range(3)
    ]
    ids = [_w(backend, lambda tx, r=r: outbox.queue(tx, r, 1.0, 100.0)) for r in rows]
    heads, last, full = _r(backend, lambda tx: outbox.heads_after(tx, 0, 5.0, 10))
    assert ([i.id for i in heads], last, full) == ([ids[0]], ids[-1], False)
    assert [i.id for i in _r(backend, lambda tx: outbox.heads_of_queues(tx, ["q1"], 5.0))] == [
        ids[0]
    ]
    peers = _r(backend, lambda tx: outbox.heads_of_peers(tx, ["peer"], 0, 5.0, [], 10))
    assert [i.id for i in peers] == [ids[0]]
    _w(backend, lambda tx: outbox.done_many(tx, ids[:2], 6.0))
    assert _r(backend, lambda tx: [r.id for r in queue_rows.listed(tx, 10)]) == [ids[2]]
    assert _w(backend, lambda tx: queue_rows.retry_now(tx, ids[2], 7.0, 200.0))
    assert _r(backend, lambda tx: queue_rows.row(tx, ids[2])).type == "t"


def test_idempotency_and_purge(backend: Backend) -> None:
    _w(backend, lambda tx: idempotency.keep(tx, "peer", "m1", 200, {"ok": True}, 1.0))
    assert _r(backend, lambda tx: idempotency.answered(tx, "peer", "m1")) == (200, {"ok": True})
    removed = _w(
        backend,
        lambda tx: purge.purge(
            tx, deliveries_before=5.0, idempotency_before=5.0, done_outbox_before=5.0, limit=10
        ),
    )
    assert removed == {"deliveries": 0, "idempotency": 1, "outbox": 0}


def test_outbox_leases(backend: Backend) -> None:
    """One host sends a row at a time; a lease that ran out is another host's to take."""
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    row = NewRow("contract", "q1", "peer", "k1", "http://x/", {"type": "t", "id": "m1"})
    oid = _w(backend, lambda tx: outbox.queue(tx, row, 1.0, 100.0))
    if isinstance(backend, PgStore):  # queued as its queue's head: leased to its queuer
        holder = "SELECT claimed_by FROM outbox WHERE id = ?"
        assert _r(backend, lambda tx: value(tx, holder, (oid,))) == backend.host
    _w(backend, lambda tx: outbox.retry_at(tx, oid, "busy", 1.0))  # its outcome ends it
    # From here this store is a third host, x: rows held by "a" or "b" are not its own.
    assert _w(backend, lambda tx: outbox.claim(tx, [oid], "a", 30.0)) == [oid]
    if isinstance(backend, Store):  # one host: nobody else sends, nothing to hold
        return
    assert _w(backend, lambda tx: outbox.claim(tx, [oid], "b", 30.0)) == []
    assert _r(backend, lambda tx: outbox.heads_of_queues(tx, ["q1"], 5.0)) == []
    assert _r(backend, lambda tx: outbox.heads_after(tx, 0, 5.0, 10))[0] == []
    _w(backend, lambda tx: outbox.retry_at(tx, oid, "busy", 2.0))  # a's outcome ends its lease
    assert _w(backend, lambda tx: outbox.claim(tx, [oid], "b", -1.0)) == [oid]
    # b's lease has run out (b died mid-send): a takes the row over.
    assert [i.id for i in _r(backend, lambda tx: outbox.heads_of_queues(tx, ["q1"], 5.0))] == [oid]
    assert _w(backend, lambda tx: outbox.claim(tx, [oid], "a", 30.0)) == [oid]


def test_open_store_picks_the_backend(tmp_path: Path) -> None:
    with open_store(tmp_path / "masd.db") as store:
        assert isinstance(store, Store)
    with pytest.raises(StoreError, match="neither a path nor a URI"):
        open_store(42)


def test_a_deadline_fires_once_whichever_host_fires_it(backend: Backend) -> None:
    """Two hosts (here: eight threads on each backend's store) fire one due handoff at
    once: the one job that finds it open closes it, every other finds it closed."""
    _w(backend, lambda tx: cases.create(tx, _view("k1"), 10.0))
    h = NewHandoff("h1", "k1", "support", "peer", 50.0, False, None, {})
    _w(backend, lambda tx: handoffs.open_handoff(tx, h, 20.0))
    expired = NewStatus("h1", "expired", None, "email", {}, True)

    def fire(tx: Tx) -> bool:  # the shape of masd.service.deadlines.fire_deadline
        found = handoffs.load(tx, "h1")
        if found is None or found.status == "expired":
            return False
        cases.load(tx, found.case_key)  # locks the case's row where several hosts write
        found = handoffs.load(tx, "h1")  # as the job it waited for left it
        if found is None or found.status == "expired":
            return False
        handoffs.record_status(tx, expired, 60.0)
        return True

    with ThreadPoolExecutor(8) as pool:
        fired = list(pool.map(lambda _: _w(backend, fire), range(8)))
    assert fired.count(True) == 1
    assert _r(backend, lambda tx: handoffs.due(tx, 100.0)) == []
