"""Erasing one case: POST /mas/v0.1/cases/{key}/erase and ``masd case erase``.

masd runs as a process with its mode endpoint and SMTP sink on loopback
(:mod:`support.watch`); the case erased has an open handoff, so the mode is
sent a ``handoff.cancel`` with reason ``erased``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from httpx_sse import aconnect_sse
from support.http import ADMIN, Running, serving, status_message
from support.http import deliver as http_deliver
from support.masd_process import WAIT, mx_mail, write_master_config
from support.postgres import postgres, postgres_server  # noqa: F401
from support.watch import ANN, BOB, Watched, watched

from masd.cli import main
from masd.config import load_config
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.read.feed import parse_cursor
from masd.service import Runtime, deliver
from masd.service import erase as erasing
from masd.store import Store, entries, open_store
from masd.store.pg_backend import PgStore
from masd.store.sql import tuples
from masd.testing import lmtpclient

EVENTS = "/mas/v0.1/events"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
ERASED = "ticket=ticket-1@help.example"
KEPT = "ticket=ticket-2@help.example"


async def _two_cases(run: Watched) -> dict[str, Any]:
    """Case 1 with an open callback handoff, case 2 without; the handoff.request sent."""
    await run.send("ticket!callback@help.example", ANN, subject="Call me")
    await run.send("ticket@help.example", BOB, subject="Just a question")
    (request,) = await run.endpoint.wait_for(1, WAIT)
    await run.sink.wait_for(2, WAIT)
    assert request.json["type"] == "handoff.request"
    body: dict[str, Any] = request.json
    return body


async def _cancel_received(run: Watched, request: dict[str, Any]) -> None:
    received = await run.endpoint.wait_for(2, WAIT)
    cancel = received[1].json
    assert cancel["type"] == "handoff.cancel"
    assert cancel["reason"] == "erased"
    assert cancel["handoff_id"] == request["handoff_id"]
    assert cancel["case"] == request["case"]


async def _gone(run: Watched) -> None:
    for path in (f"/mas/v0.1/cases/{ERASED}", f"/mas/v0.1/cases/{ERASED}/thread"):
        answer = await run.http.get(path)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"] == "unknown-case"
    again = await run.http.post(f"/mas/v0.1/cases/{ERASED}/erase")
    assert again.status_code == 404
    assert again.json()["error"] == "unknown-case"
    assert (await run.get(f"/mas/v0.1/cases/{KEPT}"))["case"]["key"] == KEPT


def _pos(event: dict[str, Any]) -> int:
    pos = parse_cursor(event["cursor"])
    assert pos is not None
    return pos


@pytest.mark.slow
def test_erase_over_http_cancels_the_handoff_and_leaves_one_entry(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            request = await _two_cases(run)
            before = await run.all_events()
            # Another peer's secret may not erase.
            async with httpx.AsyncClient(
                base_url=run.setup.http_url,
                headers={"Authorization": f"Bearer {run.setup.endpoint_token}"},
                timeout=WAIT,
            ) as mode:
                refused = await mode.post(f"/mas/v0.1/cases/{ERASED}/erase")
                assert refused.status_code == 403, refused.text
                assert refused.json()["error"] == "forbidden"
                assert (await run.get(f"/mas/v0.1/cases/{ERASED}"))["case"]["key"] == ERASED
                await _erase_and_check(run, mode, request, before)

    asyncio.run(main())


async def _erase_and_check(
    run: Watched, mode: httpx.AsyncClient, request: dict[str, Any], before: list[dict[str, Any]]
) -> None:
    answer = await run.http.post(f"/mas/v0.1/cases/{ERASED}/erase")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["ok"] is True
    erased = body["erased"]
    assert (erased["cases"], erased["handoffs"], erased["messages"]) == (1, 1, 1)
    own = [e for e in before if e["case"]["key"] == ERASED]
    assert erased["thread"] == len(own)
    await _cancel_received(run, request)
    await _gone(run)
    # The mode's status on the erased handoff, and mail to the case, are refused.
    status = status_message(ERASED, request["handoff_id"], 1, "scheduled")
    late = await mode.post("/mas/v0.1/messages", json=status)
    assert late.status_code == 404, late.text
    assert late.json()["error"] == "unknown-case"
    _, data = mx_mail(ANN, ERASED)
    result = await lmtpclient.deliver(
        ("127.0.0.1", run.setup.lmtp_port), ANN, [ERASED], data, timeout=WAIT
    )
    assert result.codes == (550,), result

    after = await run.all_events()
    kept = [e for e in before if e["case"]["key"] != ERASED]
    # The other case's events stay where they were (their deliveries may have moved on).
    assert [(e["cursor"], e["entry"]["kind"]) for e in after[:-1]] == [
        (e["cursor"], e["entry"]["kind"]) for e in kept
    ]
    last = after[-1]
    assert last["case"] == {"address": ERASED, "key": ERASED}
    assert set(last["entry"]) == {"seq", "kind", "at"}
    assert last["entry"]["kind"] == "case.erased"
    assert _pos(last) > max(_pos(e) for e in before)
    # A cursor that pointed at an erased event goes on from the next one there is.
    inside = own[0]["cursor"]
    page = await run.get("/mas/v0.1/events", after=inside)
    assert [e["cursor"] for e in page["events"]] == [
        e["cursor"] for e in after if _pos(e) > _pos(own[0])
    ]
    # Nothing else of the case is queued: the cancel was its one send.
    await asyncio.sleep(0.5)
    assert len(run.endpoint.requests) == 2


@pytest.mark.slow
def test_masd_case_erase_asks_the_running_masd(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            request = await _two_cases(run)
            ran = await run.cli("case", "erase", "TICKET=Ticket-1@Help.Example")
            assert ran.code == 0, ran.err
            assert ran.out.startswith(f"erased {ERASED}: statuses=")
            assert " cases=1" in ran.out
            await _cancel_received(run, request)
            await _gone(run)
            missing = await run.cli("case", "erase", ERASED)
            assert missing.code == 1
            assert "unknown-case" in missing.err
            kinds = [e["entry"]["kind"] for e in await run.all_events()]
            assert kinds.count("case.erased") == 1

    asyncio.run(main())


MAIL = (
    b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.com\r\n"
    b"From: Alice <alice@example.com>\r\nTo: ticket!callback@help.example\r\n"
    b"Subject: Call me\r\nMessage-ID: <erase-1@example.com>\r\n\r\nphone: +1 555 0100\r\n"
)


def _delivered(store: Store | PgStore, setup_dir: Path) -> Runtime:
    """A case with an open callback handoff, its handoff.request queued: the Runtime."""
    setup = write_master_config(setup_dir, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    counter = itertools.count(1)
    rt = Runtime(load_config(setup.config), lambda: f"id-{next(counter)}")
    mail = build_event(
        MAIL,
        mail_from="alice@example.com",
        rcpt_to="ticket!callback@help.example",
        received_at="2026-11-29T10:00:00Z",
        message_ref="msg-erase-1",
        trust=rt.trust(),
    )
    rcpt = parse_address("ticket!callback@help.example")
    store.write_sync(lambda db: deliver(rt, db, rcpt, mail, MAIL, "0" * 64, 1_790_000_000.0))
    return rt


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store | PgStore]:
    if request.param == "sqlite":
        with Store.open(tmp_path / "store.db") as store:
            yield store
        return
    uri = request.getfixturevalue("postgres").socket_uri
    with open_store(uri) as store:
        assert isinstance(store, PgStore)
        yield store


def test_the_erase_job_on_each_backend(backend: Store | PgStore, tmp_path: Path) -> None:
    rt = _delivered(backend, tmp_path / "config")
    done = backend.write_sync(lambda tx: erasing.erase(rt, tx, ERASED, 1_790_000_100.0))
    assert done.wakes.outbox
    assert (done.counts["cases"], done.counts["handoffs"], done.counts["messages"]) == (1, 1, 1)
    left = backend.read_sync(
        lambda tx: tuples(tx, "SELECT case_key, state, payload FROM outbox ORDER BY id")
    )
    # The handoff.request and the acknowledgement went with the case; the cancel waits.
    ((case_key, state, payload),) = left
    assert (case_key, state) == (ERASED, "pending")
    assert json.loads(payload)["type"] == "handoff.cancel"
    assert json.loads(payload)["reason"] == "erased"
    events = backend.read_sync(lambda tx: entries.events(tx, 0, 100))
    assert [(e.case_key, e.kind, e.address) for e in events] == [(ERASED, "case.erased", ERASED)]
    with pytest.raises(erasing.UnknownCase, match=r"no case ticket=ticket-1@help\.example"):
        backend.write_sync(lambda tx: erasing.erase(rt, tx, ERASED, 1_790_000_200.0))


def test_masd_case_erase_without_a_running_masd_erases_in_the_store(tmp_path: Path) -> None:
    config = tmp_path / "masd.toml"
    with Store.open(tmp_path / "masd.db") as store:
        _delivered(store, tmp_path)
    runner = CliRunner()
    ran = runner.invoke(main, ["case", "erase", "--config", str(config), ERASED])
    assert ran.exit_code == 0, ran.output
    assert "erasing in the store itself" in ran.stderr
    assert ran.stdout.startswith(f"erased {ERASED}: ")
    with Store.open(tmp_path / "masd.db", migrate=False) as store:
        left = store.read_sync(
            lambda tx: tuples(
                tx, "SELECT kind, state, payload FROM outbox WHERE state = 'pending' ORDER BY id"
            )
        )
        kinds = store.read_sync(lambda tx: tuples(tx, "SELECT case_key, kind FROM thread"))
    # The handoff.request still queued is gone; the cancel waits for masd to send it.
    ((kind, state, payload),) = left
    assert (kind, state) == ("contract", "pending")
    assert json.loads(payload)["type"] == "handoff.cancel"
    assert json.loads(payload)["reason"] == "erased"
    assert [tuple(k) for k in kinds] == [(ERASED, "case.erased")]
    again = runner.invoke(main, ["case", "erase", "--config", str(config), ERASED])
    assert again.exit_code == 1
    assert "unknown-case: key: no case ticket=ticket-1@help.example" in again.stderr


def test_the_hubs_tail_lets_go_of_an_erased_cases_events(tmp_path: Path) -> None:
    """A follower resuming from inside the hub's in-memory tail is not handed the erased
    case's events from there."""

    async def follow(run: Running, last: str, until_kind: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        headers = {**AUTH, "Last-Event-ID": last}
        async with aconnect_sse(run.client, "GET", EVENTS, headers=headers, timeout=None) as sse:
            async for message in sse.aiter_sse():
                if message.data:
                    got.append(json.loads(message.data))
                    if got[-1]["entry"]["kind"] == until_kind:
                        return got
        return got

    async def main() -> None:
        async with serving(tmp_path) as run:
            assert run.edge is not None
            served = run.edge.served
            watching = asyncio.ensure_future(follow(run, "e0", "case.erased"))
            await asyncio.sleep(0.3)  # the hub runs: what commits now is in its tail
            first = await http_deliver(run.store, run.rt, "ticket@help.example", run.clock.now())
            await http_deliver(run.store, run.rt, "ticket@help.example", run.clock.now())
            served.feed.poke()
            before = await _feed(run)
            own = [e for e in before if e["case"]["key"] == first.case_key]
            assert own
            await asyncio.sleep(0.3)
            assert served.hub.covers(_pos(own[0]) - 1)  # the tail holds the case's events
            erased = await run.client.post(f"/mas/v0.1/cases/{first.case_key}/erase", headers=AUTH)
            assert erased.status_code == 200, erased.text
            await asyncio.wait_for(watching, WAIT)
            # Resume from just before the erased case's first event, inside the tail.
            start = _pos(own[0]) - 1
            assert served.hub.covers(start)
            resumed = await asyncio.wait_for(follow(run, f"e{start}", "case.erased"), WAIT)
            keys = [(e["case"]["key"], e["entry"]["kind"]) for e in resumed]
            assert (first.case_key, "case.erased") in keys
            assert [k for k in keys if k[0] == first.case_key] == [(first.case_key, "case.erased")]
            assert [e["cursor"] for e in resumed] == [
                e["cursor"] for e in await _feed(run) if _pos(e) > start
            ]

    asyncio.run(main())


async def _feed(run: Running) -> list[dict[str, Any]]:
    page = await run.client.get(EVENTS, params={"limit": 1000}, headers=AUTH)
    events: list[dict[str, Any]] = page.json()["events"]
    return events
