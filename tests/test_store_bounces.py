"""The store's bounce functions on each backend (SQLite and PostgreSQL): the same answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from support.postgres import postgres, postgres_server  # noqa: F401
from test_store_backends import Backend, backend  # noqa: F401

from masd.core.engine import CaseView
from masd.store import bounces, cases, entries, outbox
from masd.store.outbox import NewRow
from masd.store.sql import Tx, run, tuples
from masd.store.thread import append_thread

KEY = "ticket=gs-1@help.example"


def _w(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.write_sync(fn)


def _r(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.read_sync(fn)


def _case_with_mail(store: Backend) -> int:
    view = CaseView(KEY, KEY, "help.example", "ticket", "gs-1", "master", "ann@example.org")

    def work(tx: Tx) -> int:
        cases.create(tx, view, 10.0)
        payload = {"mail_from": KEY, "rcpt_to": "ann@example.org", "message": "x"}
        row = NewRow("mail", f"{KEY}|smtp", "smtp", KEY, None, payload)
        oid = outbox.queue(tx, row, 10.0, 99.0)
        append_thread(tx, KEY, "mail.out", {"to": "ann@example.org", "outbox_id": oid}, at=10.0)
        return oid

    return int(_w(store, work))


def _bounce(oid: int, ref: str, status: str, at: float) -> bounces.Bounce:
    return bounces.Bounce(
        ref,
        oid,
        KEY,
        "ann@example.org",
        status,
        "smtp; 550",
        "mx.example.org",
        status[0] == "5",
        at,
    )


def test_the_secret_is_made_once_and_kept(backend: Backend) -> None:  # noqa: F811
    assert _r(backend, bounces.key_or_none) is None
    first = _w(backend, lambda tx: bounces.key(tx, 1.0))
    assert isinstance(first, bytes)
    assert len(first) == 32
    assert _w(backend, lambda tx: bounces.key(tx, 2.0)) == first
    assert _r(backend, bounces.key_or_none) == first


def test_a_mail_queued_under_its_reserved_id_is_found_by_it(backend: Backend) -> None:  # noqa: F811
    view = CaseView(KEY, KEY, "help.example", "ticket", "gs-1", "master", "ann@example.org")
    queue = f"{KEY}|smtp"

    def work(tx: Tx) -> tuple[int, bool]:
        cases.create(tx, view, 10.0)
        reserved = outbox.reserve(tx, queue)
        oid, head = reserved.read()
        payload = {"mail_from": f"ticket=gs-1+bounce-{oid}-x@help.example", "rcpt_to": "ann@x.org"}
        item, queued_head = outbox.queue_item(
            tx, NewRow("mail", queue, "smtp", KEY, None, payload), 10.0, 99.0, reserved
        )
        assert (item.id, queued_head) == (oid, head)
        append_thread(tx, KEY, "mail.out", {"to": "ann@x.org", "outbox_id": oid}, at=10.0)
        return oid, head

    oid, head = _w(backend, work)
    assert head
    (row,) = _r(backend, lambda tx: outbox.heads_of_queues(tx, [queue], 50.0))
    assert row.id == oid
    assert json.loads(row.payload)["mail_from"] == f"ticket=gs-1+bounce-{oid}-x@help.example"
    assert _r(backend, lambda tx: bounces.mail_out(tx, KEY, oid)) == (1, "ann@x.org")
    assert _r(backend, lambda tx: bounces.mail_out(tx, KEY, oid + 1)) is None
    _w(backend, lambda tx: append_thread(tx, KEY, "mail.bounced", {"mail_seq": 1}, at=11.0))
    kinds = _r(backend, lambda tx: tuples(tx, "SELECT kind FROM thread ORDER BY seq"))
    assert [k for (k,) in kinds][-1] == "mail.bounced"


def test_a_reserved_id_is_never_one_used_and_says_whether_its_row_heads_its_queue(
    backend: Backend,  # noqa: F811
) -> None:
    first = _case_with_mail(backend)
    queue, other = f"{KEY}|smtp", "ticket=gs-2@help.example|smtp"
    behind = _w(backend, lambda tx: outbox.reserve(tx, queue).read())
    alone = _w(backend, lambda tx: outbox.reserve(tx, other).read())
    assert behind[0] > first
    assert not behind[1]
    assert alone[0] > first
    assert alone[1]
    # The newest row gone (purged), the next id is still past it: ids are never reused.
    _w(backend, lambda tx: run(tx, "DELETE FROM outbox WHERE id = ?", (first,)))
    after = _w(backend, lambda tx: outbox.reserve(tx, other).read())
    assert after[0] > first
    assert after[1]
    row = NewRow("mail", other, "smtp", KEY, None, {"rcpt_to": "ann@example.org"})

    def mismatched(tx: Tx) -> None:
        outbox.queue_item(tx, row, 10.0, 99.0, outbox.reserve(tx, queue))

    with pytest.raises(ValueError, match="reserved for queue"):
        _w(backend, mismatched)
    assert _w(backend, lambda tx: outbox.queue(tx, row, 10.0, 99.0)) >= after[0]


def test_a_permanent_bounce_marks_its_mail_and_a_delay_does_not(backend: Backend) -> None:  # noqa: F811
    oid = _case_with_mail(backend)
    _w(backend, lambda tx: bounces.record(tx, _bounce(oid, "msg-delay", "4.4.1", 11.0)))
    assert _r(backend, lambda tx: bounces.bounce_of(tx, oid)) is None
    row = _r(backend, lambda tx: entries.case_entries(tx, KEY, 0, 10))[0]
    assert row.delivery is not None
    assert row.delivery.bounce is None
    _w(backend, lambda tx: bounces.record(tx, _bounce(oid, "msg-b2", "5.1.1", 13.0)))
    _w(backend, lambda tx: bounces.record(tx, _bounce(oid, "msg-b1", "5.2.2", 12.0)))
    found = _r(backend, lambda tx: bounces.bounce_of(tx, oid))
    assert found is not None
    assert (found.message_ref, found.status) == ("msg-b1", "5.2.2")
    assert found.permanent
    assert found.remote_mta == "mx.example.org"
    assert _r(backend, lambda tx: bounces.bounces_of(tx, [oid, oid + 5])) == {oid: found}
    row = _r(backend, lambda tx: entries.case_entries(tx, KEY, 0, 10))[0]
    # One row per entry, with the permanent bounce of the least message_ref.
    assert len(_r(backend, lambda tx: entries.case_entries(tx, KEY, 0, 10))) == 1
    assert row.delivery.bounce == ("5.2.2", "smtp; 550", "mx.example.org")


def test_suppressions_hold_until_they_end_and_can_be_dropped(backend: Backend) -> None:  # noqa: F811
    s = bounces.Suppression("ann@example.org", 100.0, "5.1.1", KEY, "msg-1", 10.0)
    _w(backend, lambda tx: bounces.suppress(tx, s))
    assert _r(backend, lambda tx: bounces.suppressed_until(tx, "ann@example.org")) == 100.0
    later = bounces.Suppression("ann@example.org", 200.0, "5.2.1", KEY, "msg-2", 20.0)
    _w(backend, lambda tx: bounces.suppress(tx, later))  # a later bounce extends it
    assert _r(backend, lambda tx: bounces.suppressions(tx, 50.0)) == [later]
    assert _r(backend, lambda tx: bounces.suppressions(tx, 200.0)) == []
    assert _w(backend, lambda tx: bounces.drop_suppression(tx, "ann@example.org")) is True
    assert _w(backend, lambda tx: bounces.drop_suppression(tx, "ann@example.org")) is False
    assert _r(backend, lambda tx: bounces.suppressed_until(tx, "ann@example.org")) is None
