"""The event feed under many followers: one read per commit fanned out, a cap, a follower that
does not read dropped, a replay of the whole store in bounded memory (docs/protocol.md §16.5).

Real HTTP edge on loopback, real store; the SSE clients are httpx-sse and raw sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import aconnect_sse
from support.http import ADMIN, Running, deliver, serving

from masd.read.feed_hub import FeedHub

EVENTS = "/mas/v0.1/events"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _hub(run: Running) -> FeedHub:
    assert run.edge is not None
    return run.edge.served.hub


async def _mails(run: Running, count: int, tag: str = "m") -> None:
    """``count`` new cases at once (the writer commits them together), then the feed told."""
    now = run.clock.now()
    await asyncio.gather(
        *(
            deliver(run.store, run.rt, "ticket@help.example", now, subject=f"{tag} {i}")
            for i in range(count)
        )
    )
    assert run.edge is not None
    run.edge.served.feed.poke()


async def _all(run: Running) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = "e0"
    while page := (
        await run.client.get(EVENTS, params={"after": after, "limit": 1000}, headers=AUTH)
    ).json()["events"]:
        found += page
        after = page[-1]["cursor"]
    return found


async def _follow(run: Running, seen: list[str], until: int, last: str | None = None) -> None:
    """An SSE follower: every event's cursor into ``seen`` until it has ``until``."""
    headers = dict(AUTH)
    if last is not None:
        headers["Last-Event-ID"] = last
    async with aconnect_sse(run.client, "GET", EVENTS, headers=headers, timeout=None) as source:
        assert source.response.status_code == 200
        async for sse in source.aiter_sse():
            if not sse.data:
                continue
            event = json.loads(sse.data)
            assert sse.id == event["cursor"]
            assert sse.event == event["entry"]["kind"]
            seen.append(sse.id)
            if len(seen) >= until:
                return


def test_every_follower_gets_every_event_once_in_order_from_one_read_per_commit(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            await _mails(run, 5, "before")
            history = len(await _all(run))
            batches, per_batch = 12, 4
            # Each new case is a mail.in and its acknowledgement: two events.
            total = history + batches * per_batch * 2
            seen: list[list[str]] = [[] for _ in range(20)]
            followers = [asyncio.ensure_future(_follow(run, s, total)) for s in seen]
            await asyncio.sleep(0.3)
            reads = _hub(run).reads
            began = time.monotonic()
            for b in range(batches):
                await _mails(run, per_batch, f"batch {b}")
                await asyncio.sleep(0.1)
            await asyncio.wait_for(asyncio.gather(*followers), 30)
            expected = [e["cursor"] for e in await _all(run)]
            assert len(expected) == total
            for mine in seen:
                assert mine == expected  # every event, once, in commit order
            # The hub read once per commit (and once a second when told nothing),
            # not once per commit for each of the 20 followers.
            seconds = time.monotonic() - began
            assert _hub(run).reads - reads <= batches + seconds + 3

            # Resume with Last-Event-ID: from inside the hub's tail, and from further back
            # than a tail cut to a few events (the store is read until the tail is reached).
            for cut in (None, 2000):
                if cut is not None:
                    _hub(run).tail_bytes = cut
                    await _mails(run, 4, "cut")
                    expected = [e["cursor"] for e in await _all(run)]
                start = len(expected) // 3
                rest: list[str] = []
                wanted = len(expected) - start - 1 + 4  # two more cases come
                follower = asyncio.ensure_future(_follow(run, rest, wanted, expected[start]))
                await asyncio.sleep(0.3)
                await _mails(run, 2, f"after resume {cut}")
                await asyncio.wait_for(follower, 30)
                expected = [e["cursor"] for e in await _all(run)]
                assert rest == expected[start + 1 :]

    asyncio.run(main())


async def _sse_status(run: Running, **params: str) -> httpx.Response:
    response = await run.client.get(
        EVENTS, params=params, headers={**AUTH, "Accept": "text/event-stream"}
    )
    return response


@contextlib.asynccontextmanager
async def _stream(run: Running) -> AsyncIterator[httpx.Response]:
    request = run.client.build_request(
        "GET", EVENTS, headers={**AUTH, "Accept": "text/event-stream"}, timeout=None
    )
    response = await run.client.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


def test_followers_beyond_max_followers_are_refused_with_retry_after(tmp_path: Path) -> None:
    def two(text: str) -> str:
        return text.replace("[server]\n", "[server]\nmax_followers = 2\n", 1)

    async def main() -> None:
        async with serving(tmp_path, adjust=two) as run:
            await _mails(run, 1)
            async with _stream(run) as one, _stream(run) as other:
                assert (one.status_code, other.status_code) == (200, 200)
                await asyncio.sleep(0.1)
                assert _hub(run).count == 2
                refused = await run.client.get(
                    EVENTS, headers={**AUTH, "Accept": "text/event-stream"}
                )
                assert refused.status_code == 503
                assert refused.headers["Retry-After"].isdigit()
                body = refused.json()
                assert body["error"] == "unavailable"
                assert "server.max_followers" in body["detail"]
                held = await run.client.get(
                    EVENTS, params={"after": "e2", "wait": "5"}, headers=AUTH
                )
                assert held.status_code == 503
                # A page without wait is not a follower.
                plain = await run.client.get(EVENTS, headers=AUTH)
                assert plain.status_code == 200
            for _ in range(50):  # a follower that left frees its place within a second
                if _hub(run).count == 0:
                    break
                await asyncio.sleep(0.1)
            assert _hub(run).count == 0
            again = await run.client.get(EVENTS, params={"after": "e2", "wait": "1"}, headers=AUTH)
            assert again.status_code == 200

    asyncio.run(main())


def test_a_follower_that_does_not_read_is_dropped(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            hub = _hub(run)
            hub.tail_bytes = 32 * 1024
            address = run.server.addresses[0]
            assert isinstance(address, tuple)
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(address)
            sock.sendall(
                f"GET {EVENTS} HTTP/1.1\r\nHost: masd\r\nAccept: text/event-stream\r\n"
                f"Authorization: Bearer {ADMIN}\r\n\r\n".encode()
            )
            sock.setblocking(False)
            reading: list[str] = []
            reader = asyncio.ensure_future(_follow(run, reading, 10**9))
            await asyncio.sleep(0.3)
            assert hub.count == 2
            for n in range(400):  # the one that does not read is dropped long before
                await _mails(run, 20, f"flood {n}")
                await asyncio.sleep(0.02)
                if hub.count == 1:
                    break
            assert hub.count == 1, "the follower that does not read is still followed"
            # The one that reads goes on.
            before = len(reading)
            await _mails(run, 1, "still")
            for _ in range(100):
                if len(reading) > before:
                    break
                await asyncio.sleep(0.05)
            assert len(reading) > before
            reader.cancel()
            sock.close()

    asyncio.run(main())


def _fill(run: Running, count: int) -> None:
    """``count`` more entries in the first case's thread, written straight into the store."""
    import sqlite3

    db = sqlite3.connect(run.config.server.database)
    with db:
        key = db.execute("SELECT key FROM cases ORDER BY rowid LIMIT 1").fetchone()[0]
        db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            "INSERT INTO thread (case_key, seq, kind, at, data) "
            "SELECT ?, 1000 + i, 'contract.in', 1.7e9, json_object('type', 'case.policy', "
            "'pad', printf('%.400c', 'x')) FROM n",
            (count, key),
        )
    db.close()


#: A stream quiet this long has sent all it will (a loaded machine pages slowly).
QUIET = 30.0


async def _raw_stream(
    address: tuple[str, int], read: bool, until: int = 0
) -> tuple[int, asyncio.StreamWriter]:
    """An SSE request on a raw connection; reads all it is sent (``read``) until ``until``
    events came or the stream is quiet for :data:`QUIET` seconds, or nothing at all.
    Events are counted by their ``id:`` lines, a line split between two reads included."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(
        f"GET {EVENTS} HTTP/1.1\r\nHost: masd\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {ADMIN}\r\n\r\n".encode()
    )
    got = 0
    tail = b"\n"  # the stream's last octets so far: an id line may start in one read
    while read and (not until or got < until):
        try:
            chunk = await asyncio.wait_for(reader.read(65536), QUIET)
        except TimeoutError:
            break
        if not chunk:
            break
        got += (tail[-4:] + chunk).count(b"\nid: ")
        tail = tail[-4:] + chunk
    return got, writer


def test_a_replay_of_many_events_holds_one_page_at_a_time(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            await _mails(run, 1)
            _fill(run, 20_000)  # about 12 MB of events
            address = run.server.addresses[0]
            assert isinstance(address, tuple)
            tracemalloc.start()
            try:
                base, _ = tracemalloc.get_traced_memory()
                # One that does not read: masd reads no further than what it could not send.
                _, idle = await _raw_stream(address, read=False)
                await asyncio.sleep(1.0)
                stalled, _ = tracemalloc.get_traced_memory()
                # One that reads everything.
                got, writer = await _raw_stream(address, read=True, until=20_002)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            writer.close()
            idle.close()
            assert got == 20_002
            print(
                f"\nreplay of 20,002 events: {(stalled - base) / 1e6:.1f} MB held for a client "
                f"that does not read, peak {(peak - base) / 1e6:.1f} MB"
            )
            assert stalled - base < 3_000_000
            assert peak - base < 6_000_000

    asyncio.run(main())
