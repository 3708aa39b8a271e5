"""``masd queue`` and the admin outbox API against a running masd (docs/protocol.md §16.7).

masd runs on its test clock: time stands still, so an item in backoff is
never tried again on its own, and one that goes out after ``retry`` went out
because of it.  The commands run as subprocesses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.masd_process import WAIT
from support.watch import ANN, Watched, watched

from masd.testing.peers import FakePeer

OUTBOX = "/mas/v0.1/admin/outbox"
TEST_CLOCK = ("--test-clock",)


async def _items(run: Watched) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await run.get(OUTBOX))["items"]
    return items


async def _failed_once(run: Watched, kind: str) -> dict[str, Any]:
    """The item of ``kind`` once its first attempt failed."""
    found: list[dict[str, Any]] = []

    async def look() -> bool:
        found[:] = [i for i in await _items(run) if i["kind"] == kind and i["attempts"] >= 1]
        return bool(found)

    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT
    while not await look():
        assert loop.time() < until, f"no {kind} item tried within {WAIT} s"
        await asyncio.sleep(0.05)
    return found[0]


async def _thread(run: Watched, key: str) -> list[dict[str, Any]]:
    doc = await run.get(f"/mas/v0.1/cases/{quote(key, safe='')}/thread", limit=1000)
    entries: list[dict[str, Any]] = doc["entries"]
    return entries


@pytest.mark.slow
def test_queue_lists_and_retry_sends_now(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path, args=TEST_CLOCK) as run:
            await run.sink.set_down(True)
            await run.send("ticket@help.example", ANN, subject="Help")
            item = await _failed_once(run, "mail")
            assert item["state"] == "retrying"
            assert item["to"] == ANN
            assert item["subject"] == "Re: Help"
            assert item["case"] == "ticket=ticket-1@help.example"
            assert item["last_error"]

            listed = await run.cli("queue", "list")
            assert listed.code == 0, listed.err
            header, row, error, total = listed.out.splitlines()
            assert header.split()[:3] == ["ID", "STATE", "ATTEMPTS"]
            assert row.split()[:3] == [str(item["id"]), "retrying", "1"]
            assert f"mail {item['message_id']} to {ANN}" in row
            assert error.strip().startswith("last error:")
            assert total == "1 item"

            # The clock stands still: without a retry the mail would wait forever.
            await run.sink.set_down(False)
            await asyncio.sleep(0.5)
            assert run.sink.messages == []
            retried = await run.cli("queue", "retry", str(item["id"]))
            assert retried.code == 0, retried.err
            assert retried.out.startswith(f"retried {item['id']}: retrying, next try ")
            (mail,) = await run.sink.wait_for(1, WAIT)
            assert mail.message["Message-ID"] == item["message_id"]
            empty = await run.cli("queue")
            assert empty.code == 0, empty.err
            assert empty.out.splitlines()[-1] == "0 items"

            # The same item again: it was sent.
            again = await run.cli("queue", "retry", str(item["id"]))
            assert again.code == 1
            assert "was sent at" in again.err
            unknown = await run.http.post(f"{OUTBOX}/9999/retry")
            assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown-item")
            assert (await run.http.post(f"{OUTBOX}/x/retry")).status_code == 404
            anonymous = await run.http.post(
                f"{OUTBOX}/{item['id']}/retry", headers={"Authorization": "Bearer nope"}
            )
            assert anonymous.status_code == 401

    asyncio.run(main())


@pytest.mark.slow
def test_retry_all_and_drop_record_it_in_the_thread(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path, args=TEST_CLOCK) as run:
            await run.sink.set_down(True)
            await run.send("ticket@help.example", ANN, subject="One")
            await run.send("ticket@help.example", ANN, subject="Two")
            await _failed_once(run, "mail")
            items = []
            while len(items) < 2 or any(i["attempts"] == 0 for i in items):
                items = await _items(run)
                await asyncio.sleep(0.05)
            one, two = sorted(items, key=lambda i: i["id"])

            dropped = await run.cli("queue", "drop", str(one["id"]))
            assert dropped.code == 0, dropped.err
            assert dropped.out.strip() == (
                f"dropped {one['id']} (ticket=ticket-1@help.example): the thread records it"
            )
            entries = await _thread(run, "ticket=ticket-1@help.example")
            failed = [e for e in entries if e["kind"] == "delivery.failed"]
            assert len(failed) == 1
            assert failed[0]["detail"] == "dropped by the operator"
            assert failed[0]["outbox_id"] == one["id"]
            (out,) = [e for e in entries if e["kind"] == "mail.out"]
            assert out["delivery"]["state"] == "failed"
            assert out["delivery"]["last_error"] == "dropped by the operator"
            assert out["delivery"]["attempts"] == 1
            assert [i["id"] for i in await _items(run)] == [two["id"]]
            twice = await run.cli("queue", "drop", str(one["id"]))
            assert twice.code == 1
            assert "was withdrawn (dropped by the operator)" in twice.err

            await run.sink.set_down(False)
            every = await run.cli("queue", "retry", "--all")
            assert every.code == 0, every.err
            assert every.out.strip() == "retried 1 item: due now"
            (mail,) = await run.sink.wait_for(1, WAIT)
            assert mail.message["Message-ID"] == two["message_id"]
            usage = await run.cli("queue", "retry")
            assert usage.code == 2
            assert "give an item ID or --all" in usage.err

    asyncio.run(main())


@pytest.mark.slow
def test_a_dropped_request_fails_its_handoff_and_a_failed_one_is_not_retried(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        down = FakePeer(lambda rec: (503, {"ok": False}))
        async with watched(tmp_path, args=TEST_CLOCK, endpoint=down) as run:
            await run.send("ticket!callback@help.example", ANN)
            request = await _failed_once(run, "contract")
            assert request["type"] == "handoff.request"
            assert "HTTP 503" in request["last_error"]
            answer = await run.http.post(f"{OUTBOX}/{request['id']}/drop")
            assert answer.status_code == 200, answer.text
            assert answer.json()["item"]["state"] == "failed"
            case = await run.get("/mas/v0.1/cases/ticket%3Dticket-1%40help.example")
            (handoff,) = case["case"]["handoffs"]
            assert handoff["status"] == "failed"
            entries = await _thread(run, "ticket=ticket-1@help.example")
            statuses = [e for e in entries if e["kind"] == "status"]
            assert statuses[-1]["status"] == "failed"
            assert statuses[-1]["detail"] == "dropped by the operator"
            # The participant hears that the handoff failed (the resume mail).
            resumes = [e for e in entries if e.get("purpose") == "resume"]
            assert len(resumes) == 1
            # A failed handoff.request was acted on: it is not sent again.
            refused = await run.http.post(f"{OUTBOX}/{request['id']}/retry")
            assert refused.status_code == 409
            assert refused.json()["error"] == "wrong-state"

    asyncio.run(main())


@pytest.mark.slow
def test_queue_changes_the_store_when_masd_is_not_running(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path, args=TEST_CLOCK) as run:
            await run.sink.set_down(True)
            await run.send("ticket@help.example", ANN)
            item = await _failed_once(run, "mail")
            assert await run.masd.terminate() == 0
            dropped = await run.cli("queue", "drop", str(item["id"]))
            assert dropped.code == 0, dropped.err
            assert "no masd answered" in dropped.err
            shown = await run.cli("case", "show", "ticket-1")
            assert shown.code == 0, shown.err
            assert "delivery.failed  mail id=" not in shown.out
            assert '"dropped by the operator"' in shown.out
            await run.masd.start()
            await run.sink.set_down(False)
            assert await _items(run) == []
            await asyncio.sleep(0.5)
            assert run.sink.messages == []

    asyncio.run(main())
