"""Retention's queries on each backend, SQLite and PostgreSQL (masd.store.retention)."""

from __future__ import annotations

import json

from support.postgres import postgres, postgres_server  # noqa: F401
from test_store_backends import Backend, backend  # noqa: F401

from masd.core.engine import CaseView
from masd.store import cases, entries, outbox, retention
from masd.store.handoffs import NewHandoff, open_handoff
from masd.store.outbox import NewRow
from masd.store.sql import Tx, value
from masd.store.thread import append_thread


def _case(tx: Tx, key: str, at: float) -> None:
    cases.create(
        tx, CaseView(key, f"{key}@example.org", "example.org", "ticket", key, "master", "a@b.c"), at
    )
    append_thread(tx, key, "mail.in", {"n": 1}, at=at)


def test_expired_cases_and_their_removal(backend: Backend) -> None:  # noqa: F811
    def fill(tx: Tx) -> None:
        _case(tx, "old", 10.0)
        _case(tx, "open", 10.0)
        open_handoff(tx, NewHandoff("h1", "open", "support", "peer", 500.0, False, None, {}), 11.0)
        _case(tx, "young", 90.0)
        _case(tx, "latest", 10.0)  # its entry is the store's newest
        row = NewRow("contract", "q1", "peer", "old", "http://x/", {"type": "t", "id": "m1"})
        done = outbox.queue(tx, row, 1.0, 100.0)
        outbox.done_many(tx, [done], 12.0)

    backend.write_sync(fill)
    found = backend.read_sync(
        lambda tx: retention.expired_cases(tx, "example.org", "ticket", 50.0, 10)
    )
    assert found == ["old"]
    assert backend.read_sync(lambda tx: retention.still_expired(tx, "old", 50.0))
    assert not backend.read_sync(lambda tx: retention.still_expired(tx, "young", 50.0))
    removed = backend.write_sync(lambda tx: retention.remove_case(tx, "old"))
    assert removed["cases"] == 1
    assert removed["thread"] == 1
    assert removed["outbox"] == 1
    left = backend.read_sync(
        lambda tx: (
            value(tx, "SELECT COUNT(*) FROM cases"),
            value(tx, "SELECT COUNT(*) FROM outbox_sent"),
        )
    )
    assert left == (3, 0)
    assert backend.write_sync(lambda tx: retention.purge_send_log(tx, 50.0, 10)) == 0


def test_an_erased_case_leaves_one_entry_past_its_own(backend: Backend) -> None:  # noqa: F811
    def fill(tx: Tx) -> None:
        _case(tx, "keep", 10.0)
        _case(tx, "gone", 11.0)
        open_handoff(tx, NewHandoff("h1", "gone", "support", "peer", 500.0, False, None, {}), 12.0)
        append_thread(tx, "gone", "mail.out", {"n": 2}, at=13.0)  # the store's latest entry
        row = NewRow("contract", "q1", "peer", "gone", "http://x/", {"type": "t", "id": "m1"})
        outbox.queue(tx, row, 1.0, 100.0)

    backend.write_sync(fill)
    before = backend.read_sync(lambda tx: entries.events(tx, 0, 10))
    assert [(e.case_key, e.kind) for e in before][-1] == ("gone", "mail.out")
    assert backend.write_sync(lambda tx: retention.erase_case(tx, "nobody", 14.0)) is None
    erased_at = backend.write_sync(lambda tx: retention.erase_case(tx, "gone", 14.0))
    assert erased_at is not None
    counts, pos = erased_at
    assert (counts["cases"], counts["handoffs"], counts["thread"], counts["outbox"]) == (1, 1, 2, 1)
    after = backend.read_sync(lambda tx: entries.events(tx, 0, 10))
    assert [(e.case_key, e.kind) for e in after] == [("keep", "mail.in"), ("gone", "case.erased")]
    erased = after[-1]
    assert erased.address == "gone@example.org"
    assert json.loads(erased.data) == {"address": "gone@example.org"}
    # Its position is past every one the case had, the latest included.
    assert erased.pos == pos > before[-1].pos
    # A cursor among the erased entries goes on from the next entry there is.
    inside = before[1].pos
    assert [e.kind for e in backend.read_sync(lambda tx: entries.events(tx, inside, 10))] == [
        "case.erased"
    ]
    left = backend.read_sync(lambda tx: value(tx, "SELECT COUNT(*) FROM cases"))
    assert left == 1
