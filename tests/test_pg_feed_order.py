"""The event feed on PostgreSQL by its high-water mark: a property of several hosts at once.

Several masd stores (hosts) on one database of the private server; many writers, on every
host at once, append entries to a few cases, each job holding its transaction open a random
while, some taking their transaction id before they wait for their case's row, some rolling
back; followers read the feed by cursor (:func:`masd.store.entries.events`, the feed's own
query), each read on a host picked at random, while the writers run.  Whatever the plan,
every follower sees every committed entry exactly once and no rolled-back one, all followers
see one order, one case's entries come in their order, and a read resumed from any cursor
on any host gives the rest of that order.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.core.engine import CaseView
from masd.store import cases
from masd.store.entries import events
from masd.store.pg_admin import migrate as pg_migrate
from masd.store.pg_backend import PgStore
from masd.store.sql import Tx, tuples
from masd.store.thread import append_thread

pytestmark = pytest.mark.slow

HOSTS = 3
CASES = 4
#: How long a follower keeps reading once every writer is done (the mark then passes all).
SETTLE_SECONDS = 60.0
_examples = count(1)


class Undo(Exception):
    """A job that rolls back after writing its entries."""


@dataclass(frozen=True)
class Job:
    name: str
    case: int
    entries: int
    hold: float  # seconds the transaction stays open after its entries
    early_id: bool  # takes its transaction id before it waits for the case's row
    undo: bool


jobs = st.builds(
    Job,
    name=st.just(""),
    case=st.integers(0, CASES - 1),
    entries=st.integers(1, 3),
    hold=st.floats(0, 0.006),
    early_id=st.booleans(),
    undo=st.sampled_from([False, False, True]),
)
plans = st.lists(st.lists(jobs, min_size=1, max_size=8), min_size=2, max_size=6)


@pytest.fixture
def stores(postgres: Database) -> Iterator[list[PgStore]]:  # noqa: F811
    pg_migrate(postgres.socket_uri)
    hosts = [PgStore(postgres.socket_uri) for _ in range(HOSTS)]
    try:
        yield hosts
    finally:
        for store in hosts:
            store.close()


def _job(keys: list[str], job: Job) -> object:
    def run(tx: Tx) -> None:
        if job.early_id:
            tuples(tx, "SELECT pg_current_xact_id()")
            time.sleep(job.hold / 2)
        for i in range(job.entries):
            append_thread(tx, keys[job.case], "status", {"job": job.name, "i": i}, at=1.0)
        time.sleep(job.hold)
        if job.undo:
            raise Undo(job.name)

    return run


def _follow(hosts: list[PgStore], prefix: str, writing: threading.Event) -> list[tuple[int, str]]:
    """Read the feed from the start until the writers are done and nothing is left."""
    rng = random.Random()
    cursor, seen = 0, []
    deadline = None
    while True:
        done = not writing.is_set()
        store = rng.choice(hosts)
        limit = rng.randint(1, 7)
        rows = store.read_sync(lambda tx, c=cursor, n=limit: events(tx, c, n))
        seen += [(r.pos, r.data) for r in rows if r.case_key.startswith(prefix)]
        cursor = rows[-1].pos if rows else cursor
        if done and not rows:
            return seen
        if done:
            deadline = deadline or time.monotonic() + SETTLE_SECONDS
            assert time.monotonic() < deadline, "the feed did not settle"


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=plans, followers=st.integers(1, 3))
def test_every_follower_sees_every_committed_entry_once_in_one_order(
    stores: list[PgStore], plan: list[list[Job]], followers: int
) -> None:
    prefix = f"e{next(_examples)}-"
    keys = [f"{prefix}{n}" for n in range(CASES)]
    for key in keys:
        view = CaseView(key, f"{key}@x", "x", "t", key, "master", "")
        stores[0].write_sync(lambda tx, v=view: cases.create(tx, v, 1.0))  # type: ignore[misc]
    named = [
        [dataclasses.replace(job, name=f"w{w}j{j}") for j, job in enumerate(mine)]
        for w, mine in enumerate(plan)
    ]
    committed: set[tuple[str, int]] = set()
    lock = threading.Lock()

    def writer(host: PgStore, mine: list[Job]) -> None:
        for job in mine:
            try:
                host.write_sync(_job(keys, job))  # type: ignore[arg-type]
            except Undo:
                continue
            with lock:
                committed.update((job.name, i) for i in range(job.entries))

    writing = threading.Event()
    writing.set()
    results: list[list[tuple[int, str]]] = [[] for _ in range(followers)]

    def follower(n: int) -> None:
        results[n] = _follow(stores, prefix, writing)

    readers = [threading.Thread(target=follower, args=(n,)) for n in range(followers)]
    writers = [
        threading.Thread(target=writer, args=(stores[w % HOSTS], mine))
        for w, mine in enumerate(named)
    ]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    writing.clear()
    for t in readers:
        t.join()

    order = results[0]
    seen = [(json.loads(data)["job"], json.loads(data)["i"]) for _, data in order]
    assert len(seen) == len(set(seen)), "an entry was read twice"
    assert set(seen) == committed, "a committed entry was missed, or a rolled-back one read"
    for other in results[1:]:
        assert other == order, "two followers read two orders"
    positions = [pos for pos, _ in order]
    assert positions == sorted(positions)
    by_case = stores[0].read_sync(
        lambda tx: tuples(
            tx,
            "SELECT case_key, seq, pos FROM thread WHERE case_key LIKE ? ORDER BY pos",
            (prefix + "%",),
        )
    )
    for key in keys:
        seqs = [int(seq) for k, seq, _ in by_case if k == key]
        assert seqs == sorted(seqs), f"case {key}: entries out of their order"
    # A read resumed from any cursor, on any host, gives the rest of the one order.
    rng = random.Random(len(order))
    for start in rng.sample(range(len(order) + 1), min(4, len(order) + 1)):
        cursor = order[start - 1][0] if start else 0
        host = rng.choice(stores)
        rest = [
            (r.pos, r.data)
            for r in host.read_sync(lambda tx, c=cursor: events(tx, c, 10_000))
            if r.case_key.startswith(prefix)
        ]
        assert rest == order[start:]
