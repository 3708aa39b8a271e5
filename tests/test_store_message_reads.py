"""The scoped read side's queries (intakes, scoped events and cases, raw bytes) on each backend.

``backend`` is parametrized over SQLite and PostgreSQL as in ``tests/test_store_backends.py``;
the PostgreSQL one runs on a private server and is skipped (naming why) where there is none,
unless ``MASD_REQUIRE_SYSTEM_TESTS`` is set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.postgres import postgres, postgres_server  # noqa: F401

from masd.core.engine import CaseView
from masd.core.event import build_event
from masd.core.trust import TrustSettings
from masd.read import messages as read_messages
from masd.store import Store, cases, message_reads, messages, open_store, retention
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, send, tuples
from masd.store.thread import append_thread

Backend = Store | PgStore
RAW = b"From: pat@example.org\r\nSubject: hi\r\n\r\n" + bytes(range(256)) * 4


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        with Store.open(tmp_path / "masd.db") as store:
            yield store
        return
    with open_store(request.getfixturevalue("postgres").socket_uri) as store:
        assert isinstance(store, PgStore)
        yield store


def _w(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.write_sync(fn)


def _r(store: Backend, fn: Callable[[Tx], Any]) -> Any:
    return store.read_sync(fn)


def _case(store: Backend, key: str, domain: str, type_: str, at: float) -> None:
    address = key if "@" in key else f"{key}@{domain}"
    view = CaseView(key, address, domain, type_, key, "master", "Ann@Example.org")
    _w(store, lambda tx: cases.create(tx, view, at))
    _w(store, lambda tx: append_thread(tx, key, "mail.in", {"key": key}, at=at))


def _record(store: Backend, ref: str, *, intake: tuple[str, str, str, float] | None) -> None:
    ev = _event(RAW, ref)
    sha = hashlib.sha256(RAW).hexdigest()

    def job(tx: Tx) -> None:
        iref = None if intake is None else intake[0]
        messages.record(tx, ev, RAW, sha, 5.0, dedupe=f"d-{ref}", case_key=None, intake_ref=iref)
        if intake is not None:
            messages.open_intake(tx, intake[0], intake[1], intake[2], ref, None, intake[3])

    _w(store, job)


def test_raw_whole_and_ranges(backend: Backend) -> None:
    _record(backend, "m1", intake=None)
    assert _r(backend, lambda tx: message_reads.raw_whole(tx, "m1")) == RAW
    assert _r(backend, lambda tx: message_reads.raw_whole(tx, "nope")) is None
    for offset, length in [(0, 10), (7, 100), (len(RAW) - 3, 10), (len(RAW), 5), (len(RAW) + 9, 1)]:
        got = _r(backend, lambda tx, o=offset, n=length: message_reads.raw_range(tx, "m1", o, n))
        assert got == RAW[offset : offset + length], (offset, length)
    assert _r(backend, lambda tx: message_reads.raw_range(tx, "nope", 0, 1)) is None
    assert _r(backend, lambda tx: message_reads.message(tx, "m1"))["size"] == len(RAW)


def _intakes(store: Backend, **kw: Any) -> list[message_reads.IntakeRow]:
    args: dict[str, Any] = {"state": None, "after": 0, "limit": 10, "scope": None} | kw
    return list(_r(store, lambda tx: message_reads.intakes(tx, **args)))


def test_intakes_in_order_by_state_and_scope(backend: Backend) -> None:
    _case(backend, "k1", "help.example", "ticket", 1.0)
    # i-b and i-c share one instant: a page that ends on one of them takes the other too
    for ref, domain, at in [
        ("i-a", "help.example", 10.0),
        ("i-c", "help.example", 11.0),
        ("i-b", "shop.example", 11.0),
        ("i-d", "help.example", 12.5),
    ]:
        _record(backend, f"m-{ref}", intake=(ref, domain, "ticket", at))
    _w(backend, lambda tx: messages.assign_intake(tx, "i-a", "k1", 20.0))
    every = _intakes(backend)
    refs = [r.intake_ref for r in every]
    if isinstance(backend, Store):
        assert refs == ["i-a", "i-c", "i-b", "i-d"]  # as recorded: the rowid
    else:
        assert refs == ["i-a", "i-b", "i-c", "i-d"]  # created_at, then intake_ref
    assert [r.pos for r in every] == sorted(r.pos for r in every)
    assert (every[1].pos == every[2].pos) is isinstance(backend, PgStore)
    first = every[0]
    assert (first.case_key, first.address, first.assigned_at) == ("k1", "k1@help.example", 20.0)
    assert [r.intake_ref for r in _intakes(backend, state="pending")] == refs[1:]
    assert [r.intake_ref for r in _intakes(backend, state="assigned")] == ["i-a"]
    scoped = _intakes(backend, scope=["help.example/ticket", "x/y"])
    assert [r.intake_ref for r in scoped] == [r for r in refs if r != "i-b"]
    assert _intakes(backend, scope=[]) == []
    # paging by the last position shown sees each intake once
    seen: list[str] = []
    after = 0
    while page := _intakes(backend, after=after, limit=2 if not seen else 1):
        seen += [r.intake_ref for r in page]
        after = page[-1].pos
    assert seen == refs


K1, K2, K3 = "ticket=1@help.example", "order=2@shop.example", "ticket=3@help.example"


def test_scoped_events_and_cases(backend: Backend) -> None:
    _case(backend, K1, "help.example", "ticket", 1.0)
    _case(backend, K2, "shop.example", "order", 2.0)
    _case(backend, K3, "help.example", "ticket", 3.0)
    _w(backend, lambda tx: append_thread(tx, K1, "mail.in", {"key": K1}, at=4.0))
    scope = ["help.example/ticket"]

    def events(after: int, case_key: str | None, scope: list[str]) -> list[tuple[str, int]]:
        found = _r(backend, lambda tx: message_reads.scoped_events(tx, after, 10, case_key, scope))
        return [(e.case_key, e.seq) for e in found]

    assert events(0, None, scope) == [(K1, 1), (K3, 1), (K1, 2)]
    assert events(0, K1, scope) == [(K1, 1), (K1, 2)]
    assert events(0, K2, scope) == []
    assert events(0, None, [*scope, "shop.example/order"])[1] == (K2, 1)
    all_events = _r(backend, lambda tx: message_reads.scoped_events(tx, 0, 10, None, scope))
    assert events(all_events[0].pos, None, scope) == [(K3, 1), (K1, 2)]
    assert json.loads(all_events[0].data) == {"key": K1}

    def listed(scope: list[str], **kw: Any) -> list[str]:
        args: dict[str, Any] = {
            "before": None,
            "limit": 10,
            "open_handoff": None,
            "participant": None,
            "domain": None,
        } | kw
        found = _r(backend, lambda tx: message_reads.scoped_cases(tx, scope=scope, **args))
        return [c.key for c in found]

    assert listed(scope) == [K1, K3]
    assert listed([*scope, "shop.example/order"]) == [K1, K3, K2]
    assert listed(scope, participant="ANN@example.org", open_handoff=False) == [K1, K3]
    assert listed(scope, open_handoff=True) == []
    assert listed(scope, domain="shop.example") == []
    assert listed(scope, limit=1) == [K1]
    top = _r(
        backend,
        lambda tx: message_reads.scoped_cases(
            tx, before=None, limit=1, open_handoff=None, participant=None, domain=None, scope=scope
        ),
    )[0]
    assert listed(scope, before=top.last_pos) == [K3]
    assert listed([]) == []
    # An erased case's one entry is still in its scope: the key names it, not the case row.
    _w(backend, lambda tx: retention.erase_case(tx, K1, 5.0))
    assert events(0, None, scope) == [(K3, 1), (K1, 3)]
    assert events(0, None, ["shop.example/order"]) == [(K2, 1)]


def _event(raw: bytes, ref: str) -> Any:
    return build_event(
        raw,
        mail_from="pat@example.org",
        rcpt_to="ticket@help.example",
        received_at="2026-09-21T10:00:00Z",
        message_ref=ref,
        trust=TrustSettings.of([]),
    ).event


def test_a_reply_text_that_is_the_whole_text_is_kept_once_and_read_back_whole(
    backend: Backend,
) -> None:
    whole = _event(b"From: pat@example.org\r\nSubject: hi\r\n\r\nThe printer is on fire.\r\n", "m1")
    quoting = _event(
        b"From: pat@example.org\r\nSubject: Re: hi\r\n\r\nStill burning.\r\n\r\n"
        b"On Mon, 1 Jan 2026, Ann wrote:\r\n> Is it out?\r\n",
        "m2",
    )
    assert whole.reply_text == whole.text
    assert quoting.reply_text == "Still burning."
    _case(backend, "k1", "help.example", "ticket", 1.0)
    opened = ("i1", "help.example", "ticket", "m1", None, 2.0)
    _w(backend, lambda tx: messages.open_intake(tx, *opened))

    def job(tx: Tx) -> None:
        for ev, intake in ((whole, "i1"), (quoting, None)):
            raw = ev.text.encode()
            sha, dedupe = hashlib.sha256(raw).hexdigest(), f"d-{ev.message_ref}"
            messages.record(tx, ev, raw, sha, 5.0, dedupe=dedupe, case_key="k1", intake_ref=intake)

    _w(backend, job)
    stored = dict(_r(backend, lambda tx: tuples(tx, "SELECT message_ref, event FROM messages")))
    assert json.loads(stored["m1"])["reply_text"] == ""  # the text is not kept twice
    assert json.loads(stored["m2"])["reply_text"] == "Still burning."
    # Every reader gets the event as masd sends it.
    for ev in (whole, quoting):
        sender = _r(backend, partial(messages.on_case, case_key="k1", message_ref=ev.message_ref))
        assert sender.event == ev.to_json()
        read = _r(backend, partial(read_messages.message, message_ref=ev.message_ref))
        assert read.event == ev.to_json()
    found = _r(backend, lambda tx: messages.intake(tx, "i1"))
    assert found.view.event == whole.to_json()
    latest = _r(backend, lambda tx: messages.latest_from(tx, "k1", "pat@example.org"))
    assert latest.event in (whole.to_json(), quoting.to_json())


def test_an_event_recorded_before_reply_text_existed_gets_it_from_its_text_for_every_reader(
    backend: Backend,
) -> None:
    quoting = _event(
        b"From: pat@example.org\r\nSubject: Re: hi\r\n\r\nStill burning.\r\n\r\n"
        b"On Mon, 1 Jan 2026, Ann wrote:\r\n> Is it out?\r\n",
        "m3",
    )
    _case(backend, "k1", "help.example", "ticket", 1.0)
    _w(backend, lambda tx: messages.open_intake(tx, "i3", "help.example", "ticket", "m3", None, 2))
    old = quoting.to_json()
    del old["reply_text"]  # as a row written before the field existed keeps it

    def job(tx: Tx) -> None:
        raw = quoting.text.encode()
        sha = hashlib.sha256(raw).hexdigest()
        messages.record(tx, quoting, raw, sha, 5.0, dedupe="d-m3", case_key="k1", intake_ref="i3")
        send(tx, "UPDATE messages SET event = ? WHERE message_ref = ?", (json.dumps(old), "m3"))

    _w(backend, job)
    stored = dict(_r(backend, lambda tx: tuples(tx, "SELECT message_ref, event FROM messages")))
    assert "reply_text" not in json.loads(stored["m3"])
    sender = _r(backend, partial(messages.on_case, case_key="k1", message_ref="m3"))
    read = _r(backend, partial(read_messages.message, message_ref="m3"))
    found = _r(backend, lambda tx: messages.intake(tx, "i3"))
    for event in (sender.event, read.event, found.view.event):
        assert event == quoting.to_json()
        assert event["reply_text"] == "Still burning."
