"""The event feed and the case list over real sockets against a running masd (docs/protocol.md §16).

The feed is read as JSON (paged, long-polled) and as Server-Sent Events with
a real SSE client (httpx-sse), which resumes from ``Last-Event-ID`` across a
``kill -9`` of masd: every event is seen once, none skipped, none twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from httpx_sse import aconnect_sse
from support.masd_process import WAIT, mx_mail, wait_until
from support.watch import ANN, BOB, Watched, watched

from masd.testing import lmtpclient
from masd.testing.peers import FakePeer

EVENTS = "/mas/v0.1/events"
CASES = "/mas/v0.1/cases"


async def _thread(run: Watched, key: str) -> list[dict[str, Any]]:
    doc = await run.get(f"{CASES}/{quote(key, safe='')}/thread", limit=1000)
    entries: list[dict[str, Any]] = doc["entries"]
    return entries


def _fixed(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries without their delivery state (read live, it moves between two reads)."""
    return [{k: v for k, v in e.items() if k != "delivery"} for e in entries]


@pytest.mark.slow
def test_the_feed_pages_in_commit_order_and_long_polls(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            first = await run.get(EVENTS)
            assert first == {"events": [], "next": first["next"]}
            await run.send("ticket@help.example", ANN, subject="One")
            await run.send("ticket!callback@help.example", BOB, subject="Two")
            await run.endpoint.wait_for(1, WAIT)
            events = await run.all_events()
            # Every entry of every case, each once, in the order masd committed them.
            keys = sorted({e["case"]["key"] for e in events})
            assert keys == ["ticket=ticket-1@help.example", "ticket=ticket-2@help.example"]
            for key in keys:
                mine = [e["entry"] for e in events if e["case"]["key"] == key]
                assert _fixed(mine) == _fixed(await _thread(run, key))
            assert len({e["cursor"] for e in events}) == len(events)
            assert events[0]["entry"]["kind"] == "mail.in"
            assert events[0]["case"]["address"] == "ticket=ticket-1@help.example"

            # Paging: two at a time gives the same events.
            paged: list[dict[str, Any]] = []
            after = first["next"]
            while page := (await run.get(EVENTS, after=after, limit=2))["events"]:
                assert len(page) <= 2
                paged += page
                after = paged[-1]["cursor"]
            assert [e["cursor"] for e in paged] == [e["cursor"] for e in events]

            # One case only, by its address in any spelling or by its id.
            two = await run.get(EVENTS, case="TICKET=Ticket-2@Help.Example")
            assert _fixed([e["entry"] for e in two["events"]]) == _fixed(
                await _thread(run, "ticket=ticket-2@help.example")
            )
            by_id = await run.get(EVENTS, case="ticket-2")
            assert [e["cursor"] for e in by_id["events"]] == [e["cursor"] for e in two["events"]]

            # A long poll is held until an event commits, then answered with it.
            last = events[-1]["cursor"]
            held = asyncio.ensure_future(run.get(EVENTS, after=last, wait=30))
            await asyncio.sleep(0.3)
            assert not held.done()
            await run.send("ticket@help.example", ANN, subject="Three")
            got = await asyncio.wait_for(held, WAIT)
            assert got["events"][0]["entry"]["kind"] == "mail.in"
            assert got["events"][0]["entry"]["subject"] == "Three"
            assert got["next"] == got["events"][-1]["cursor"]
            # Nothing after the end: an empty page whose next is where it started.
            end = await run.get(EVENTS, after=got["next"], wait=1)
            assert end == {"events": [], "next": got["next"]}

    asyncio.run(main())


@pytest.mark.slow
def test_the_feed_refuses_by_name(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            await run.send("ticket@help.example", ANN)
            anonymous = await run.http.get(EVENTS, headers={"Authorization": ""})
            assert anonymous.status_code == 401
            for params, name in (
                ({"after": "41"}, "after"),
                ({"after": "c4"}, "after"),
                ({"limit": "0"}, "limit"),
                ({"limit": "1001"}, "limit"),
                ({"wait": "61"}, "wait"),
                ({"wait": "-1"}, "wait"),
            ):
                response = await run.http.get(EVENTS, params=params)
                assert response.status_code == 400, (params, response.text)
                body = response.json()
                assert body["error"] == "invalid-message"
                assert body["detail"].startswith(f"{name}:")
            # A cursor past the store's latest event is from another store.
            ahead = await run.http.get(EVENTS, params={"after": "e99999"})
            assert ahead.status_code == 400
            assert "past the latest event" in ahead.json()["detail"]
            unknown = await run.http.get(EVENTS, params={"case": "ticket=nope@help.example"})
            assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown-case")

    asyncio.run(main())


async def _sender(run: Watched, count: int, sent: list[str]) -> None:
    """Deliver ``count`` mails, each until masd takes it, as an MTA retries: the same
    bytes again, so one that masd recorded before its answer was lost is recorded once."""
    for i in range(count):
        _, data = mx_mail(ANN, "ticket@help.example", subject=f"Mail {i}")
        while True:
            try:
                result = await lmtpclient.deliver(
                    ("127.0.0.1", run.setup.lmtp_port), ANN, ["ticket@help.example"], data
                )
            except (OSError, lmtpclient.LmtpError, TimeoutError):
                result = None
            if result is not None and result.codes == (250,):
                sent.append(f"Mail {i}")
                break
            await asyncio.sleep(0.1)


async def _follow(run: Watched, seen: list[dict[str, Any]], stop: asyncio.Event) -> int:
    """Follow the feed as SSE, reconnecting with Last-Event-ID; returns the reconnects."""
    last: str | None = None
    reconnects = -1
    async with httpx.AsyncClient(base_url=run.setup.http_url, timeout=None) as client:
        while not stop.is_set():
            headers = {"Authorization": f"Bearer {run.setup.admin_token}"}
            if last is not None:
                headers["Last-Event-ID"] = last
            reconnects += 1
            with contextlib.suppress(httpx.HTTPError, OSError):
                async with aconnect_sse(client, "GET", EVENTS, headers=headers) as source:
                    source.response.raise_for_status()
                    async for sse in source.aiter_sse():
                        event = json.loads(sse.data)
                        assert sse.id == event["cursor"]
                        assert sse.event == event["entry"]["kind"]
                        seen.append(event)
                        last = sse.id
            await asyncio.sleep(0.1)
    return reconnects


@pytest.mark.slow
def test_sse_resumes_across_kill_9_without_skipping_or_repeating(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            seen: list[dict[str, Any]] = []
            sent: list[str] = []
            stop = asyncio.Event()
            follower = asyncio.ensure_future(_follow(run, seen, stop))
            sender = asyncio.ensure_future(_sender(run, 40, sent))
            for _ in range(2):  # two kill -9 while mail comes in and the feed streams
                before = len(seen)
                await wait_until(lambda n=before: len(seen) > n + 10, "events streamed")
                run.masd.kill()
                await asyncio.sleep(0.3)
                await run.masd.start()
            await asyncio.wait_for(sender, 4 * WAIT)
            feed = await run.all_events()
            await wait_until(lambda: len(seen) >= len(feed), "every event streamed")
            stop.set()
            # The stream ends only when masd stops; SIGTERM ends it cleanly.
            assert await run.masd.terminate() == 0
            reconnects = await asyncio.wait_for(follower, WAIT)
            await run.masd.start()

            cursors = [e["cursor"] for e in seen]
            repeated = len(cursors) - len(set(cursors))
            skipped = len({e["cursor"] for e in feed} - set(cursors))
            print(
                f"\nSSE across 2 kill -9: {len(feed)} events, {len(seen)} seen, "
                f"{skipped} skipped, {repeated} repeated, {reconnects} connections tried again"
            )
            assert (skipped, repeated) == (0, 0)
            assert cursors[: len(feed)] == [e["cursor"] for e in feed]
            assert _fixed([e["entry"] for e in seen[: len(feed)]]) == _fixed(
                [e["entry"] for e in feed]
            )
            assert reconnects >= 2
            # Every mail the MTA handed over is on the feed once.
            subjects = [e["entry"]["subject"] for e in feed if e["entry"]["kind"] == "mail.in"]
            assert sorted(subjects) == sorted(set(sent)) == sorted(f"Mail {i}" for i in range(40))

    asyncio.run(main())


@pytest.mark.slow
def test_the_case_list_filters_and_pages(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path, endpoint=FakePeer()) as run:
            await run.send("ticket@help.example", ANN, subject="first")
            await run.send("ticket!callback@help.example", BOB, subject="second")
            await run.send("ticket@help.example", BOB, subject="third")
            await run.endpoint.wait_for(1, WAIT)
            doc = await run.get(CASES)
            keys = [c["key"] for c in doc["cases"]]
            # Newest activity first.
            assert keys == [f"ticket=ticket-{n}@help.example" for n in (3, 2, 1)]
            assert doc["next"] is None
            two = doc["cases"][1]
            assert two["participant"] == BOB
            assert two["open_handoff"]["mode"] == "callback"
            assert two["open_handoff"]["status"] == "requested"
            assert two["opened_at"] <= two["last_activity_at"]
            assert set(two) >= {"address", "key", "role", "participant", "opened_at"}

            # Activity on case 1 moves it to the top.
            await run.send("ticket=ticket-1@help.example", ANN, subject="again")
            keys = [c["key"] for c in (await run.get(CASES))["cases"]]
            assert keys[0] == "ticket=ticket-1@help.example"

            opened = await run.get(CASES, state="open")
            assert [c["key"] for c in opened["cases"]] == ["ticket=ticket-2@help.example"]
            closed = await run.get(CASES, state="closed")
            assert len(closed["cases"]) == 2
            bobs = await run.get(CASES, participant="BOB@example.net")
            assert {c["key"] for c in bobs["cases"]} == {
                "ticket=ticket-2@help.example",
                "ticket=ticket-3@help.example",
            }

            # One at a time: each case once, then next is null.
            paged, after = [], None
            while True:
                params: dict[str, Any] = {"limit": 1}
                if after is not None:
                    params["after"] = after
                page = await run.get(CASES, **params)
                paged += [c["key"] for c in page["cases"]]
                after = page["next"]
                if after is None:
                    break
            assert paged == keys

            for params in ({"state": "stuck"}, {"after": "e1"}, {"limit": "0"}):
                response = await run.http.get(CASES, params=params)
                assert response.status_code == 400, response.text
                assert response.json()["error"] == "invalid-message"

    asyncio.run(main())


@pytest.mark.slow
def test_delivery_state_shows_mail_that_has_not_left(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            await run.sink.set_down(True)
            await run.send("ticket@help.example", ANN)
            key = "ticket=ticket-1@help.example"

            def retrying(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
                out = [e for e in entries if e["kind"] == "mail.out"]
                if out and out[0]["delivery"]["state"] == "retrying":
                    return out[0]["delivery"]
                return None

            found: list[dict[str, Any]] = []

            async def look() -> bool:
                got = retrying(await _thread(run, key))
                if got is not None:
                    found.append(got)
                return got is not None

            loop = asyncio.get_running_loop()
            until = loop.time() + WAIT
            while not await look():
                assert loop.time() < until, "the acknowledgement never showed as retrying"
                await asyncio.sleep(0.1)
            delivery = found[-1]
            assert delivery["attempts"] >= 1
            assert delivery["last_error"]
            assert delivery["next_attempt_at"] is not None
            assert delivery["done_at"] is None

            await run.sink.set_down(False)
            await run.sink.wait_for(1, 4 * WAIT)

            async def sent() -> bool:
                out = [e for e in await _thread(run, key) if e["kind"] == "mail.out"]
                return out[0]["delivery"]["state"] == "sent"

            until = loop.time() + WAIT
            while not await sent():
                assert loop.time() < until, "the acknowledgement never showed as sent"
                await asyncio.sleep(0.1)
            out = next(e for e in await _thread(run, key) if e["kind"] == "mail.out")
            assert out["delivery"]["done_at"] is not None
            assert out["delivery"]["last_error"] is None

    asyncio.run(main())
