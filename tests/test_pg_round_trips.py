"""Round trips to PostgreSQL on a delivered mail's path, counted by a proxy on loopback.

A database on another machine costs a network round trip per turn of masd's conversation with
it, whatever the statements do: a delivered mail (a new case, its acknowledgement queued) is
held to at most :data:`MOST` round trips, counted by :class:`masd.testing.tcp_proxy.TcpProxy`
between the store and the private server (write jobs run in pipeline mode: only a statement
whose result the job reads waits for the server).

The proxy also sees the pools' own traffic: a connection opened in the background (its
start-up may span several mails), and the ping on a connection's first use
(masd.store.pg_backend).  A mail during which either
happened is not counted: the figure is the job's own conversation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.postgres import Database, postgres, postgres_server  # noqa: F401
from support.ticket import write_ticket_config
from test_deliver_cost import AT, Rig, message

from masd.core.address import parse_address
from masd.core.bounce import split_bounce
from masd.core.event import build_event
from masd.service import Delivered, bounce_mail, deliver
from masd.store import outbox, pg_backend
from masd.store.pg_admin import migrate as pg_migrate
from masd.store.pg_backend import PgStore
from masd.store.sql import tuples
from masd.testing.tcp_proxy import TcpProxy

#: Round trips a delivered mail may cost today: one per result its job reads, and the
#: commit (docs/performance.md lists them).
MOST = 3
#: Mails counted, out of at most :data:`TRIES` delivered.
COUNTED, TRIES = 5, 30


@pytest.fixture
def counted(postgres: Database) -> Iterator[tuple[PgStore, TcpProxy]]:  # noqa: F811
    pg_migrate(postgres.uri, postgres.password)
    port = int(postgres.uri.rsplit(":", 1)[1].split("/", 1)[0])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        uri = f"postgresql://masd@127.0.0.1:{proxy.port}/{postgres.name}"
        with PgStore(uri, password=postgres.password) as store:
            yield store, proxy


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many connections were pinged on their first use after a while idle, so far."""
    counter = [0]
    ping = pg_backend.ping

    def counted_ping(conn: Any, wait: Any) -> None:
        counter[0] += 1
        ping(conn, wait)

    monkeypatch.setattr(pg_backend, "ping", counted_ping)
    return counter


def costs_of(proxy: TcpProxy, pings: list[int], run: Callable[[int], object]) -> list[int]:
    """The round trips of ``run(n)`` for :data:`COUNTED` of at most :data:`TRIES` runs: a run
    during which the connections' housekeeping rode along is left out."""
    costs: list[int] = []
    left_out = 0
    for n in range(TRIES):
        before = (proxy.round_trips, proxy.connections, pings[0])
        starting = proxy.starting  # a connection still authenticating trips on its own
        run(n)
        if starting or (proxy.connections, pings[0]) != before[1:]:
            left_out += 1  # the connections' housekeeping rode along: not the job's trips
            continue
        costs.append(proxy.round_trips - before[0])
        if len(costs) == COUNTED:
            break
    print(f"\nround trips: {costs} ({left_out} left out)")
    assert len(costs) == COUNTED, f"{left_out} of {TRIES} runs shared the pools' housekeeping"
    return costs


def test_a_delivered_mail_costs_a_bounded_number_of_round_trips(
    tmp_path: Path, counted: tuple[PgStore, TcpProxy], pings: list[int]
) -> None:
    store, proxy = counted
    config = write_ticket_config(tmp_path, ticket="acknowledge = true")
    rig = Rig(config)
    for n in range(2):  # connections opened, the bounce secret made and then kept
        rig.deliver(store, message(message_id=f"<warm-{n}@example.com>"))
    keys: list[str] = []
    costs = costs_of(
        proxy,
        pings,
        lambda n: keys.append(rig.deliver(store, message(message_id=f"<m-{n}@example.com>"))[1]),
    )
    kinds = store.read_sync(
        lambda tx: tuples(tx, "SELECT kind FROM thread WHERE case_key = ? ORDER BY seq", keys[-1:])
    )
    print(f"its thread {kinds}")
    assert ("mail.in",) in kinds
    assert max(costs) <= MOST, costs
    # Each acknowledgement was queued with the bounce address that names its own row.
    queued = store.read_sync(lambda tx: tuples(tx, "SELECT id, case_key, payload FROM outbox"))
    assert len(queued) == len(keys) + 2
    tags = [(split_bounce(json.loads(p)["mail_from"], "+"), key) for _, key, p in queued]
    named = store.read_sync(
        lambda tx: [bounce_mail.verify(tx, key, found.tag) for found, key in tags if found]
    )
    assert named == [item_id for item_id, _, _ in queued]


def test_the_record_of_a_relayed_mail_is_one_round_trip(
    counted: tuple[PgStore, TcpProxy], pings: list[int]
) -> None:
    """The sender records the relay's ``250`` in a transaction of its own: its answers (the
    row was pending; nothing is behind it) come back with the commit."""
    store, proxy = counted
    row = outbox.NewRow("mail", "q|smtp", "smtp", None, None, {"n": 1})

    def queued(n: int) -> int:
        one = replace(row, queue=f"q{n}|smtp")
        return store.write_sync(lambda tx: outbox.queue_item(tx, one, AT, AT + 60))[0].id

    ids = [queued(n) for n in range(TRIES)]
    answers: list[tuple[bool, bool]] = []
    costs = costs_of(
        proxy,
        pings,
        lambda n: answers.append(store.write_sync(lambda tx: outbox.relayed(tx, ids[n], AT))()),
    )
    assert set(answers) == {(True, False)}
    assert max(costs) == 1, costs


def test_a_repeat_is_found_by_recording_it_and_answered_as_the_duplicate(
    tmp_path: Path, counted: tuple[PgStore, TcpProxy]
) -> None:
    """The delivery does not look for its dedupe key first: the repeat's take of the key
    fails, its run is rolled back, and the second run finds the first copy."""
    store, _ = counted
    rig = Rig(write_ticket_config(tmp_path, ticket="acknowledge = true"))
    raw = message(message_id="<once@example.com>")
    mail = build_event(
        raw,
        mail_from="alice@example.com",
        rcpt_to="ticket@help.example",
        received_at="2026-09-21T10:00:00Z",
        message_ref="msg-once",
        trust=rig.rt.trust(),
    )
    address = parse_address("ticket@help.example")

    def once(at: float) -> Delivered:
        return store.write_sync(lambda tx: deliver(rig.rt, tx, address, mail, raw, "ab" * 32, at))

    first = once(AT)
    conflicts = store.conflicts
    again = once(AT + 60)
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.case_key == first.case_key
    assert store.conflicts == conflicts + 1  # the repeat cost one run, rolled back
    counts = store.read_sync(
        lambda tx: tuples(
            tx,
            "SELECT (SELECT COUNT(*) FROM cases), (SELECT COUNT(*) FROM messages), "
            "(SELECT COUNT(*) FROM outbox)",
        )
    )
    assert counts == [(1, 1, 1)]  # one case, one copy, one acknowledgement
