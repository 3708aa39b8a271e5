"""How the outbox finds queue heads (masd/edges/outbox_heads.py), against a real store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from masd.edges.outbox_heads import PAGE, HeadFinder, look
from masd.service import OutboxItem
from masd.store import Store

T0 = 1_700_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "masd.db") as s:
        yield s


def insert(store: Store, rows: list[tuple[str, str, float]]) -> list[int]:
    """(queue, peer, next_attempt_at) rows, pending; returns their ids."""

    def job(db: Any) -> list[int]:
        ids = []
        for queue, peer, at in rows:
            cur = db.execute(
                "INSERT INTO outbox (kind, queue, peer, url, payload, created_at, next_attempt_at, "
                "deliver_until) VALUES ('contract', ?, ?, 'http://p/', ?, ?, ?, ?)",
                (queue, peer, json.dumps({"id": queue}), T0, at, T0 + 86400),
            )
            ids.append(int(cur.lastrowid))
        return ids

    return store.write_sync(job)


def done(store: Store, ids: list[int]) -> None:
    def job(db: Any) -> None:
        db.conn.executemany("UPDATE outbox SET state = 'done' WHERE id = ?", [(i,) for i in ids])

    store.write_sync(job)


def step(store: Store, finder: HeadFinder, now: float, *, settle: bool = True) -> list[OutboxItem]:
    """One look as the sender makes it: each head found is sent (or turned away by the
    lane ``full``); with ``settle``, sent at once and recorded done."""
    ask = finder.ask(now, frozenset(), {})
    found = store.read_sync(lambda db: look(db, ask))
    finder.update(ask, found)
    taken = []
    for item in found.items:
        lane = str(item.peer)
        finder.seen(lane, item)
        if lane == "full":
            finder.turned_away(lane, item)
        else:
            taken.append(item)
    if settle:
        done(store, [i.id for i in taken])
        finder.ended.update(i.queue for i in taken)
    return taken


def until_quiet(store: Store, finder: HeadFinder, now: float) -> list[OutboxItem]:
    out: list[OutboxItem] = []
    for _ in range(100):
        got = step(store, finder, now)
        out += got
        if not got:
            return out
    raise AssertionError("looks never ran dry")


def test_first_look_finds_what_is_due_and_pages_through_a_backlog(store: Store) -> None:
    ids = insert(store, [(f"q{n}", "a", T0) for n in range(PAGE * 2 + 7)])
    insert(store, [("later", "a", T0 + 60)])
    finder = HeadFinder()
    found = until_quiet(store, finder, T0)
    assert [i.id for i in found] == ids  # each once, oldest first
    assert step(store, finder, T0 + 61)[0].queue == "later"  # fell due


def test_rows_behind_a_head_go_when_the_head_ends(store: Store) -> None:
    first, second = insert(store, [("q", "a", T0), ("q", "a", T0)])
    finder = HeadFinder()
    assert [i.id for i in step(store, finder, T0, settle=False)] == [first]
    assert step(store, finder, T0, settle=False) == []  # the second is no head yet
    done(store, [first])
    finder.ended.add("q")
    assert [i.id for i in step(store, finder, T0)] == [second]


def test_heads_a_lane_turned_away_are_found_when_it_has_room(store: Store) -> None:
    waiting = insert(store, [(f"w{n}", "full", T0) for n in range(10)])
    finder = HeadFinder()
    assert until_quiet(store, finder, T0) == []
    assert finder.waiting == {"full": waiting[0]}
    # The lane has room for 4, then for the rest.
    ask = finder.ask(T0, frozenset(), {"full": 4})
    found = store.read_sync(lambda db: look(db, ask))
    finder.update(ask, found)
    assert [i.id for i in found.items] == waiting[:4]
    assert finder.waiting == {"full": waiting[3] + 1}
    ask = finder.ask(T0, frozenset({"w4"}), {"full": 32})  # w4 in flight meanwhile
    found = store.read_sync(lambda db: look(db, ask))
    finder.update(ask, found)
    assert [i.id for i in found.items] == waiting[5:]
    assert finder.waiting == {}


def test_rows_falling_due_at_the_same_instant_are_all_found_across_pages(store: Store) -> None:
    finder = HeadFinder()
    assert step(store, finder, T0) == []
    ids = insert(store, [(f"q{n}", "a", T0 + 30) for n in range(PAGE + 5)])
    assert step(store, finder, T0 + 10) == []  # new, but not yet due
    found = until_quiet(store, finder, T0 + 30)
    assert [i.id for i in found] == ids


def test_a_look_drops_heads_whose_queue_was_in_flight_when_asked(store: Store) -> None:
    insert(store, [("busy", "a", T0), ("free", "a", T0)])
    finder = HeadFinder()
    ask = finder.ask(T0, frozenset({"busy"}), {})
    found = store.read_sync(lambda db: look(db, ask))
    assert [i.queue for i in found.items] == ["free"]


def test_next_at_is_the_earliest_row_not_yet_due(store: Store) -> None:
    insert(store, [("a", "a", T0 + 5), ("b", "a", T0 + 2), ("c", "a", T0 - 1)])
    ask = HeadFinder().ask(T0, frozenset(), {})
    assert store.read_sync(lambda db: look(db, ask)).next_at == T0 + 2
