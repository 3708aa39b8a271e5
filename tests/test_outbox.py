"""The outbox sender (docs/protocol.md §5, §10) against a real peer, a real relay and a real
store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.bounces import bounce_case
from support.outbox import (
    CALLBACK_PEER,
    CALLBACK_TOKEN,
    Env,
    deliver,
    eventually,
    inbound,
    query,
    run_env,
)

from masd.clock import TestClock
from masd.edges.context import EdgeContext
from masd.edges.outbox import Outbox
from masd.testing import FakePeer, Recorded

REQUEST = "ticket!callback@help.example"
INTAKE = "ticket@help.example"
CASE = "ticket=gs-1@help.example"


def outbox_of(env: Env) -> Outbox:
    return Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics))


async def outbox_rows(env: Env) -> list[dict[str, Any]]:
    return await query(env, "SELECT * FROM outbox ORDER BY id")


async def thread(env: Env, kind: str) -> list[dict[str, Any]]:
    entries = await query(
        env, "SELECT data FROM thread WHERE case_key = ? AND kind = ? ORDER BY seq", (CASE, kind)
    )
    return [json.loads(e["data"]) for e in entries]


def contract(rec: Recorded) -> dict[str, Any]:
    assert isinstance(rec.json, dict)
    return rec.json


def test_handoff_request_and_acknowledgement_go_out(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        raw, mid = inbound(REQUEST)
        delivered = await deliver(env, REQUEST, raw)
        assert delivered.case_key == CASE
        outbox = outbox_of(env)
        outbox.start()
        [req] = await env.peer.wait_for(1)
        [mail] = await env.sink.wait_for(1)
        await outbox.stop()

        assert req.method == "POST"
        assert req.path == "/mas"
        assert req.headers["authorization"] == f"Bearer {CALLBACK_TOKEN}"
        assert req.headers["content-type"] == "application/json"
        msg = contract(req)
        assert msg["type"] == "handoff.request"
        assert msg["case"] == {"address": CASE, "key": CASE}
        assert msg["mode"] == "callback"
        assert msg["participant"] == {"address": "alice@example.com"}
        assert msg["details"] == {"subject": "Please call me", "phone": "+1 555 0100"}
        assert msg["status_url"] == "http://127.0.0.1:8025/mas/v0.1/messages"
        [handoff] = await query(env, "SELECT handoff_id FROM handoffs")
        assert msg["handoff_id"] == handoff["handoff_id"]

        assert bounce_case(mail.mail_from) == CASE  # its bounce address (protocol §22)
        assert mail.rcpt_tos == ("alice@example.com",)
        m = mail.message
        assert m["From"] == CASE
        assert m["To"] == "alice@example.com"
        assert m["Auto-Submitted"] == "auto-replied"
        assert m["In-Reply-To"] == mid
        assert m["References"] == mid
        assert m["Message-ID"].endswith("@help.example>")
        assert CASE in m.get_content()

        assert [r["state"] for r in await outbox_rows(env)] == ["done", "done"]
        assert env.metrics.value("masd_outbox_attempts_total", kind="contract", result="done") == 1
        assert env.metrics.value("masd_outbox_attempts_total", kind="mail", result="done") == 1

    run_env(tmp_path, body)


def test_5xx_is_retried_with_the_same_id_and_delivered_once(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        env.peer.answer((503, {"ok": False, "error": "busy"}))
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox = outbox_of(env)
        outbox.start()
        first, second = await env.peer.wait_for(2)
        await env.sink.wait_for(1)
        await outbox.stop()

        assert contract(first)["id"] == contract(second)["id"]
        assert first.body == second.body
        assert len(env.peer.requests) == 2
        request_row = next(r for r in await outbox_rows(env) if r["kind"] == "contract")
        assert request_row["state"] == "done"
        assert request_row["attempts"] == 2
        assert env.metrics.value("masd_outbox_attempts_total", kind="contract", result="retry") == 1
        [status] = await query(env, "SELECT status FROM handoffs")
        assert status["status"] == "requested"

    run_env(tmp_path, body)


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (400, {"ok": False, "error": "invalid-message", "detail": "details.phone: not a number"}),
        (307, "see elsewhere"),  # redirects are never followed: refused like a 4xx
    ],
)
def test_refused_handoff_request_records_failed_and_resumes_by_mail(
    tmp_path: Path, status: int, answer: Any
) -> None:
    async def body(env: Env) -> None:
        env.peer.answer((status, answer))
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox = outbox_of(env)
        outbox.start()
        ack, resume = await env.sink.wait_for(2)
        await outbox.stop()

        assert len(env.peer.requests) == 1  # not retried
        [handoff] = await query(env, "SELECT handoff_id, status, closed_at FROM handoffs")
        assert handoff["status"] == "failed"
        assert handoff["closed_at"] is not None
        [failed] = await query(
            env,
            "SELECT source, data FROM statuses WHERE handoff_id = ? AND status = 'failed'",
            (handoff["handoff_id"],),
        )
        assert failed["source"] == "email"
        detail = json.loads(failed["data"])["detail"]
        assert detail.startswith(f"HTTP {status}: ")
        [df] = await thread(env, "delivery.failed")
        assert df["type"] == "handoff.request"
        assert df["peer"] == CALLBACK_PEER
        assert df["detail"] == detail
        if status == 400:
            assert "details.phone: not a number" in detail

        assert "has been received" in ack.message.get_content()
        assert "could not be carried out" in resume.message.get_content()
        assert resume.message["Auto-Submitted"] == "auto-replied"
        states = {r["kind"]: r["state"] for r in await outbox_rows(env) if r["kind"] == "contract"}
        assert states == {"contract": "failed"}
        assert (
            env.metrics.value("masd_outbox_attempts_total", kind="contract", result="failed") == 1
        )

    run_env(tmp_path, body)


def test_one_queue_keeps_its_order_under_retries_and_does_not_block_others(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §10: "Messages about one case to one peer are delivered in order"."""
    seen_a1 = 0

    def script(rec: Recorded) -> tuple[int, Any]:
        nonlocal seen_a1
        if contract(rec)["id"] == "a1":
            seen_a1 += 1
            if seen_a1 == 1:
                return 502, {"ok": False}
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        assert isinstance(env.clock, TestClock)
        now = env.clock.now()

        def insert(db: Any) -> None:
            for queue, mid in [("A", "a1"), ("A", "a2"), ("B", "b1"), ("A", "a3"), ("B", "b2")]:
                db.execute(
                    "INSERT INTO outbox (kind, queue, peer, url, payload, created_at, "
                    "next_attempt_at, deliver_until) VALUES ('contract', ?, ?, ?, ?, ?, ?, ?)",
                    (
                        queue,
                        CALLBACK_PEER,
                        env.peer.url + "mas",
                        json.dumps({"type": "test", "id": mid}),
                        now,
                        now,
                        now + 3600,
                    ),
                )

        await env.store.write(insert)
        outbox = outbox_of(env)
        outbox.start()
        # The clock stands still: a1 waits in backoff, b1 and b2 go on.
        await env.peer.wait_for(3)
        await eventually(
            lambda: env.metrics.value(
                "masd_outbox_attempts_total", kind="contract", result="retry"
            ),
            "a1's failed attempt recorded",
        )
        ids = [contract(r)["id"] for r in env.peer.requests]
        assert sorted(ids) == ["a1", "b1", "b2"]
        assert ids.index("b1") < ids.index("b2")

        env.clock.advance(301)  # past any backoff step
        await env.peer.wait_for(6)
        await outbox.stop()
        ids = [contract(r)["id"] for r in env.peer.requests]
        assert [i for i in ids if i.startswith("a")] == ["a1", "a1", "a2", "a3"]
        assert len(ids) == 6
        assert {r["state"] for r in await outbox_rows(env)} == {"done"}

    run_env(tmp_path, body, clock=TestClock(1_700_000_000.0), peer=FakePeer(script))


def test_pending_rows_survive_a_restart(tmp_path: Path) -> None:
    up = False

    def script(rec: Recorded) -> tuple[int, Any]:
        return (200, {"ok": True}) if up else (500, {"ok": False})

    async def body(env: Env) -> None:
        nonlocal up
        await env.sink.set_down(True)
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox = outbox_of(env)
        outbox.start()
        await env.peer.wait_for(1)
        await eventually(
            lambda: (
                env.metrics.value("masd_outbox_attempts_total", kind="mail", result="retry")
                and env.metrics.value("masd_outbox_attempts_total", kind="contract", result="retry")
            ),
            "both first attempts recorded",
        )
        await outbox.stop()
        before = await outbox_rows(env)
        assert [r["state"] for r in before] == ["pending", "pending"]
        assert all(r["attempts"] >= 1 for r in before)
        assert "Connect" in before[1]["last_error"] or "refused" in before[1]["last_error"]

        # A new masd on the same store file delivers what was pending.
        up = True
        await env.sink.set_down(False)
        again = env.reopen()
        env.store = again.store
        outbox = outbox_of(again)
        outbox.start()
        await env.sink.wait_for(1)

        async def all_done() -> bool:
            return all(r["state"] == "done" for r in await outbox_rows(again))

        await eventually(all_done, "every pending row delivered")
        await outbox.stop()
        requests = env.peer.requests
        assert len(requests) >= 2
        assert {contract(r)["id"] for r in requests} == {contract(requests[0])["id"]}

    run_env(tmp_path, body, peer=FakePeer(script))


def test_unreachable_peer_is_retried(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.peer.close()  # nothing listens at the endpoint's port any more
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox = outbox_of(env)
        outbox.start()
        await env.sink.wait_for(1)
        await eventually(
            lambda: env.metrics.value(
                "masd_outbox_attempts_total", kind="contract", result="retry"
            ),
            "a failed connection recorded",
        )
        await outbox.stop()
        row = next(r for r in await outbox_rows(env) if r["kind"] == "contract")
        assert row["state"] == "pending"
        assert row["last_error"].startswith("connect failed")

    run_env(tmp_path, body)


def test_smtp_relay_down_is_retried_not_lost(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.sink.set_down(True)
        await deliver(env, INTAKE, inbound(INTAKE)[0])
        outbox = outbox_of(env)
        outbox.start()
        await eventually(
            lambda: env.metrics.value("masd_outbox_attempts_total", kind="mail", result="retry"),
            "a refused connection recorded",
        )
        [row] = await outbox_rows(env)
        assert row["state"] == "pending"
        assert "refused" in row["last_error"].lower()
        await env.sink.set_down(False)
        [mail] = await env.sink.wait_for(1)
        await outbox.stop()
        assert mail.message["From"] == CASE
        [row] = await outbox_rows(env)
        assert row["state"] == "done"

    run_env(tmp_path, body)


def test_smtp_4xx_is_retried(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        env.sink.refuse("451 4.3.0 try again later")
        await deliver(env, INTAKE, inbound(INTAKE)[0])
        outbox = outbox_of(env)
        outbox.start()
        [mail] = await env.sink.wait_for(1)
        await outbox.stop()
        assert len(env.sink.refused) == 1
        assert env.sink.refused[0].raw == mail.raw  # the same message, again
        [row] = await outbox_rows(env)
        assert (row["state"], row["attempts"]) == ("done", 2)

    run_env(tmp_path, body)


@pytest.mark.parametrize("at", ["DATA", "RCPT"])
def test_smtp_5xx_records_delivery_failed(tmp_path: Path, at: Any) -> None:
    async def body(env: Env) -> None:
        env.sink.refuse("554 5.7.1 rejected by policy", at=at)
        await deliver(env, INTAKE, inbound(INTAKE)[0])
        outbox = outbox_of(env)
        outbox.start()
        await eventually(
            lambda: env.metrics.value("masd_outbox_attempts_total", kind="mail", result="failed"),
            "the refusal recorded",
        )
        await outbox.stop()
        assert env.sink.messages == []
        [row] = await outbox_rows(env)
        assert row["state"] == "failed"
        [df] = await thread(env, "delivery.failed")
        assert df["kind"] == "mail"
        assert df["to"] == "alice@example.com"
        assert df["detail"] == "SMTP 554 5.7.1 rejected by policy"

    run_env(tmp_path, body)


def test_stop_lets_an_in_flight_send_finish(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def slow(rec: Recorded) -> tuple[int, Any]:
        await release.wait()
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox = outbox_of(env)
        outbox.start()
        await env.peer.wait_for(1)
        stopping = asyncio.create_task(outbox.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waiting for the send in flight
        release.set()
        await stopping
        row = next(r for r in await outbox_rows(env) if r["kind"] == "contract")
        assert row["state"] == "done"

    run_env(tmp_path, body, peer=FakePeer(slow))


def test_outbox_hands_mail_to_its_transport(tmp_path: Path) -> None:
    """The mail seam: an outbox given a transport sends mail through it, and closes it."""
    from masd.testing import MemoryMailTransport

    async def body(env: Env) -> None:
        transport = MemoryMailTransport()
        raw, _ = inbound(INTAKE)
        await deliver(env, INTAKE, raw)
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), mail=transport)
        outbox.start()
        try:
            (mail,) = await transport.wait_for(1)
        finally:
            await outbox.stop()
        assert mail.domain == "help.example"
        assert bounce_case(mail.mail_from) == CASE  # its bounce address (protocol §22)
        assert b"Auto-Submitted: auto-replied" in mail.message
        assert transport.closed
        assert env.sink.messages == []

    run_env(tmp_path, body)


def test_a_lane_keeps_its_in_flight_limit_and_finds_every_head_it_turned_away(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §10 "Isolation": each peer its own in-flight limit; nothing waiting is
    forgotten.
    """
    in_flight = most = 0

    async def slow(rec: Recorded) -> tuple[int, Any]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        cases = 30
        for n in range(cases):
            sender = f"user{n}@example.com"
            await deliver(env, REQUEST, inbound(REQUEST, sender=sender)[0], sender=sender)
        outbox = Outbox(
            EdgeContext(env.rt, env.store, env.clock, env.metrics),
            peer_in_flight=2,
            relay_in_flight=1,
        )
        outbox.start()
        await env.peer.wait_for(cases)
        await env.sink.wait_for(cases)

        async def all_done() -> bool:
            return {r["state"] for r in await outbox_rows(env)} == {"done"}

        await eventually(all_done, "every row recorded done")
        await outbox.stop()
        assert most == 2
        ids = [contract(r)["id"] for r in env.peer.requests]
        assert len(ids) == len(set(ids)) == cases  # each once
        assert len(env.sink.messages) == cases

    run_env(tmp_path, body, peer=FakePeer(slow))


def test_rows_recorded_while_it_runs_go_out_in_order(tmp_path: Path) -> None:
    """New rows are found by id; a row behind a busy head goes once the head is done."""
    release = asyncio.Event()

    async def held(rec: Recorded) -> tuple[int, Any]:
        if contract(rec)["type"] == "handoff.request":
            await release.wait()
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        outbox = outbox_of(env)
        outbox.start()
        await deliver(env, REQUEST, inbound(REQUEST)[0])
        outbox.wake()
        [req] = await env.peer.wait_for(1)
        # A handoff.cancel queued on the same case and peer while the request is in flight.
        handoff_id = contract(req)["handoff_id"]

        def queue_behind(db: Any) -> None:
            now = env.clock.now()
            db.execute(
                "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
                "next_attempt_at, deliver_until) VALUES ('contract', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    f"{CASE}|{CALLBACK_PEER}",
                    CALLBACK_PEER,
                    CASE,
                    env.peer.url + "mas",
                    json.dumps({"type": "handoff.cancel", "id": "c-1", "handoff_id": handoff_id}),
                    now,
                    now,
                    now + 3600,
                ),
            )

        await env.store.write(queue_behind)
        outbox.wake()
        await asyncio.sleep(0.2)
        assert len(env.peer.requests) == 1  # the cancel waits for the request
        release.set()
        _, cancel = await env.peer.wait_for(2)
        await outbox.stop()
        assert contract(cancel)["id"] == "c-1"

    run_env(tmp_path, body, peer=FakePeer(held))


def test_a_mail_the_relay_took_is_recorded_at_once_not_behind_other_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's ``250`` is committed in a write of its own while the lease is held, not in
    the write that marks other rows done: with that write held in flight (a contract
    message's), the mail's row is done all the same.  Behind it, a host killed meanwhile
    would leave the mail to be sent again (docs/operations.md §11)."""
    from masd.testing import MemoryMailTransport

    marking, release = asyncio.Event(), asyncio.Event()
    write_done = Outbox._write_done

    async def held(self: Outbox, item_ids: list[int]) -> None:
        marking.set()
        await release.wait()
        await write_done(self, item_ids)

    monkeypatch.setattr(Outbox, "_write_done", held)

    async def body(env: Env) -> None:
        async def mail_rows_done() -> bool:
            rows = await query(env, "SELECT state FROM outbox WHERE kind = 'mail'")
            return bool(rows) and all(r["state"] == "done" for r in rows)

        transport = MemoryMailTransport()
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), mail=transport)
        outbox.start()
        try:
            await deliver(env, REQUEST, inbound(REQUEST)[0])  # a handoff.request to the peer
            outbox.wake()
            await eventually(marking.is_set, "the contract message's done record under way")
            await deliver(env, INTAKE, inbound(INTAKE)[0])  # an acknowledgement by mail
            outbox.wake()
            await transport.wait_for(1)
            await eventually(mail_rows_done, "the mail's row done while the other record waits")
            assert not release.is_set()
        finally:
            release.set()
            await outbox.stop()

    run_env(tmp_path, body)
