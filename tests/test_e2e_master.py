"""Black-box runs of the master role (docs/protocol.md §11, §3-§6, §9-§10, §12).

masd runs as a real process (``python -m masd serve --config FILE``) with a
configuration written here.  Everything is on loopback: mail goes in over
LMTP (:mod:`masd.testing.lmtpclient`), the mode endpoint is a
:class:`~masd.testing.peers.FakePeer`, the SMTP relay an
:class:`~masd.testing.peers.SmtpSink`, and what masd recorded is read back
through the HTTP read side (docs/protocol.md §16) with the admin secret.

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from support.masd_process import (
    WAIT,
    MasdProcess,
    MasterSetup,
    mx_mail,
    wait_until,
)
from support.watch import watched

from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, ReceivedMail, Recorded, SmtpSink

ANN = "ann@example.org"
BOB = "bob@example.net"


# --------------------------------------------------------------------------- mail


make_mail = mx_mail


def case_address(n: int) -> str:
    return f"ticket=ticket-{n}@help.example"


# --------------------------------------------------------------------------- the harness


@dataclass
class Run:
    """One masd process with its peers, and the ways a test talks to them."""

    setup: MasterSetup
    masd: MasdProcess
    endpoint: FakePeer
    sink: SmtpSink
    http: httpx.AsyncClient

    async def deliver(self, rcpts: list[str], mail_from: str, data: bytes) -> lmtpclient.LmtpResult:
        return await lmtpclient.deliver(
            ("127.0.0.1", self.setup.lmtp_port), mail_from, rcpts, data, timeout=WAIT
        )

    async def send(self, rcpt: str, sender: str, **kw: Any) -> str:
        """Deliver one mail to one recipient; it must be accepted (250)."""
        message_id, data = make_mail(sender, rcpt, **kw)
        result = await self.deliver([rcpt], sender, data)
        assert result.codes == (250,), result
        return message_id

    async def case(self, n: int) -> dict[str, Any]:
        response = await self.http.get(f"/mas/v0.1/cases/{quote(case_address(n), safe='')}")
        assert response.status_code == 200, response.text
        doc: dict[str, Any] = response.json()["case"]
        return doc

    async def case_status(self, n: int) -> int:
        response = await self.http.get(f"/mas/v0.1/cases/{quote(case_address(n), safe='')}")
        return response.status_code

    async def thread(self, n: int) -> list[dict[str, Any]]:
        path = f"/mas/v0.1/cases/{quote(case_address(n), safe='')}/thread"
        entries: list[dict[str, Any]] = []
        after = 0
        while True:
            response = await self.http.get(path, params={"after": after, "limit": 1000})
            assert response.status_code == 200, response.text
            page = response.json()
            entries += page["entries"]
            if not page["entries"]:
                return entries
            after = page["next"]

    async def kinds(self, n: int, kind: str) -> list[dict[str, Any]]:
        return [e for e in await self.thread(n) if e["kind"] == kind]

    async def wait_thread(
        self, n: int, test: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT
        while True:
            entries = await self.thread(n)
            if test(entries):
                return entries
            if loop.time() > until:
                shown = json.dumps(entries, indent=1)
                raise AssertionError(f"{what}: not in the thread of ticket-{n}:\n{shown}")
            await asyncio.sleep(0.05)

    async def post_status(
        self, request: Recorded, seq: int, status: str, *, mid: str | None = None, **fields: Any
    ) -> httpx.Response:
        """POST ``handoff.status`` for the handoff of ``request``, as the mode endpoint."""
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": mid or secrets.token_hex(16),
            "case": request.json["case"],
            "handoff_id": request.json["handoff_id"],
            "seq": seq,
            "status": status,
            **fields,
        }
        return await self.http.post(
            request.json["status_url"],
            json=message,
            headers={"Authorization": f"Bearer {self.setup.endpoint_token}"},
        )

    def contract(self, mtype: str) -> list[Recorded]:
        return [r for r in self.endpoint.requests if r.json and r.json.get("type") == mtype]


@asynccontextmanager
async def running(
    tmp_path: Path, *, endpoint: FakePeer | None = None, deadline: str = "1h"
) -> AsyncIterator[Run]:
    """masd with a fake callback endpoint and a mail sink; SIGTERM at the end must exit 0."""
    async with watched(tmp_path, endpoint=endpoint, deadline=deadline) as w:
        yield Run(w.setup, w.masd, w.endpoint, w.sink, w.http)


def text_of(mail: ReceivedMail) -> str:
    part = mail.message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


# --------------------------------------------------------------------------- intake


@pytest.mark.slow
def test_intake_creates_case_and_acknowledges(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            message_id, data = make_mail(ANN, "ticket@help.example", subject="My invoice")
            result = await run.deliver(["ticket@help.example"], ANN, data)
            assert result.codes == (250,)
            assert result.recipients[0].final.enhanced == "2.0.0"

            case = await run.case(1)
            assert case["address"] == case_address(1)
            assert case["role"] == "master"
            assert case["participant"] == ANN

            (ack,) = await run.sink.wait_for(1, WAIT)
            msg = ack.message
            assert ack.rcpt_tos == (ANN,)
            assert email.utils.parseaddr(msg["From"])[1] == case_address(1)
            assert email.utils.parseaddr(msg["To"])[1] == ANN
            assert msg["Auto-Submitted"] == "auto-replied"
            assert msg["In-Reply-To"] == message_id
            assert message_id in msg["References"]
            assert msg["Message-ID"].endswith("@help.example>")
            assert case_address(1) in text_of(ack)

            kinds = [e["kind"] for e in await run.thread(1)]
            assert kinds == ["mail.in", "mail.out"]

            # docs/protocol.md §3: the same message again is accepted and recorded once.
            again = await run.deliver(["ticket@help.example"], ANN, data)
            assert again.codes == (250,)
            assert await run.case_status(2) == 404
            assert [e["kind"] for e in await run.thread(1)] == ["mail.in", "mail.out"]
            assert run.endpoint.requests == []

    asyncio.run(main())


# --------------------------------------------------------------------------- handoff to a mode


@pytest.mark.slow
def test_callback_request_statuses_and_one_resume_mail(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            await run.send(
                "ticket!callback@help.example",
                BOB,
                subject="Call me",
                body="Please call.\n\nPhone: +1 555 0100\n",
            )
            (request,) = await run.endpoint.wait_for(1, WAIT)
            assert request.method == "POST"
            assert request.path == "/mas"
            assert request.headers["authorization"] == f"Bearer {run.setup.endpoint_token}"
            assert request.headers["content-type"].startswith("application/json")
            body = request.json
            assert body["mas_modes_version"] == "0.1"
            assert body["type"] == "handoff.request"
            assert body["case"] == {"address": case_address(1), "key": case_address(1)}
            assert body["mode"] == "callback"
            assert body["details"] == {"subject": "Call me", "phone": "+1 555 0100"}
            assert body["status_url"] == run.setup.messages_url
            assert body["participant"] == {"address": BOB}
            assert len(body["handoff_id"]) >= 32  # docs/protocol.md §2: at least 128 bits

            await run.sink.wait_for(1, WAIT)  # the acknowledgement
            for seq, status in ((1, "scheduled"), (2, "running")):
                response = await run.post_status(request, seq, status)
                assert response.status_code == 200, response.text
                assert response.json() == {"ok": True}
            done = await run.post_status(request, 3, "completed", mid="status-done-1")
            assert done.status_code == 200, done.text

            # docs/protocol.md §7: a repeated id is already processed: the same answer, nothing new.
            mails_before = len(await run.kinds(1, "mail.out"))
            again = await run.post_status(request, 3, "completed", mid="status-done-1")
            assert (again.status_code, again.json()) == (done.status_code, done.json())
            assert len(await run.kinds(1, "mail.out")) == mails_before == 2
            # A status whose seq is not greater than the last one is stale.
            stale = await run.post_status(request, 2, "running")
            assert (stale.status_code, stale.json()) == (200, {"ok": True, "ignored": "stale"})

            statuses = [(e["status"], e["source"]) for e in await run.kinds(1, "status")]
            assert statuses == [
                ("requested", "email"),
                ("scheduled", "mode"),
                ("running", "mode"),
                ("completed", "mode"),
            ]
            (handoff,) = (await run.case(1))["handoffs"]
            assert (handoff["handoff_id"], handoff["status"]) == (body["handoff_id"], "completed")

            _, resume = await run.sink.wait_for(2, WAIT)
            assert "completed" in text_of(resume)
            assert resume.message["Auto-Submitted"] == "auto-replied"
            assert email.utils.parseaddr(resume.message["From"])[1] == case_address(1)
            assert resume.rcpt_tos == (BOB,)
            assert len(await run.kinds(1, "mail.out")) == 2

    asyncio.run(main())


@pytest.mark.slow
def test_negotiation_question_and_update(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            await run.send("ticket!callback@help.example", ANN, body="Call me, please.\n")
            (request,) = await run.endpoint.wait_for(1, WAIT)
            assert request.json["details"] == {"subject": "Help, please"}
            response = await run.post_status(request, 1, "negotiating", needs=["phone"])
            assert response.status_code == 200, response.text

            _, question = await run.sink.wait_for(2, WAIT)
            assert question.message["Auto-Submitted"] == "auto-replied"
            assert email.utils.parseaddr(question.message["From"])[1] == case_address(1)
            assert "phone:" in text_of(question).splitlines()

            # Someone else's reply supplies nothing (docs/protocol.md §4).
            await run.send(case_address(1), BOB, body="phone: +1 555 6666\n")
            # The participant's reply, quoting the question, supplies the phone.
            await run.send(
                case_address(1),
                ANN,
                subject="Re: " + question.message["Subject"],
                body="phone: +1 555 0199\n\n> phone:\n",
                in_reply_to=question.message["Message-ID"],
            )
            requests = await run.endpoint.wait_for(2, WAIT)
            updates = run.contract("handoff.update")
            assert len(requests) == 2
            assert len(updates) == 1
            update = updates[0].json
            assert update["handoff_id"] == request.json["handoff_id"]
            assert update["case"] == request.json["case"]
            assert update["details"] == {"phone": "+1 555 0199"}
            assert updates[0].headers["authorization"] == f"Bearer {run.setup.endpoint_token}"

            response = await run.post_status(request, 2, "scheduled", at="2030-01-01T10:00:00Z")
            assert response.status_code == 200, response.text
            (handoff,) = (await run.case(1))["handoffs"]
            assert handoff["status"] == "scheduled"

    asyncio.run(main())


# --------------------------------------------------------------------------- refusals


@pytest.mark.slow
def test_mode_without_endpoint_refused_mode_unavailable(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            message_id = await run.send("ticket!chat@help.example", ANN)
            entries = await run.thread(1)
            statuses = [e for e in entries if e["kind"] == "status"]
            assert [(s["status"], s.get("reason")) for s in statuses] == [
                ("requested", None),
                ("refused", "mode-unavailable"),
            ]
            assert all(s["source"] == "email" for s in statuses)
            # docs/protocol.md §5: the acknowledgement and the resume notice are one mail.
            assert len([e for e in entries if e["kind"] == "mail.out"]) == 1
            (mail,) = await run.sink.wait_for(1, WAIT)
            text = text_of(mail)
            assert case_address(1) in text
            assert "refused" in text
            assert mail.message["In-Reply-To"] == message_id
            assert run.endpoint.requests == []

    asyncio.run(main())


@pytest.mark.slow
def test_mode_not_in_modes_refused_mode_not_enabled(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            await run.send("ticket!video@help.example", ANN)
            statuses = await run.kinds(1, "status")
            assert [(s["status"], s.get("reason")) for s in statuses] == [
                ("requested", None),
                ("refused", "mode-not-enabled"),
            ]
            (mail,) = await run.sink.wait_for(1, WAIT)
            assert "refused" in text_of(mail)
            assert run.endpoint.requests == []

    asyncio.run(main())


@pytest.mark.slow
def test_unauthenticated_sender_blocked_and_never_mailed(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            # No trusted A-R: one written by a foreign host does not count.
            await run.send(
                "ticket!callback@help.example",
                BOB,
                body="phone: +1 555 0100\n",
                authserv_id="mx.attacker.example",
            )
            entries = await run.thread(1)
            statuses = [(e["status"], e.get("reason")) for e in entries if e["kind"] == "status"]
            assert statuses == [("requested", None), ("refused", "blocked")]
            refused = [e for e in entries if e["kind"] == "mail.refused"]
            assert [r["reason"] for r in refused] == ["unauthenticated-sender"]
            assert not [e for e in entries if e["kind"] == "mail.out"]

            # An automated sender is recorded too and not answered either.
            await run.send(
                "ticket@help.example",
                "noreply@shop.example",
                headers={"Auto-Submitted": "auto-replied"},
            )
            refused = await run.kinds(2, "mail.refused")
            assert [r["reason"] for r in refused] == ["automated-sender"]

            # A real participant afterwards is answered; nothing ever went to the others.
            await run.send("ticket@help.example", ANN)
            (mail,) = await run.sink.wait_for(1, WAIT)
            assert mail.rcpt_tos == (ANN,)
            assert run.endpoint.requests == []

    asyncio.run(main())


@pytest.mark.slow
def test_second_request_while_one_is_open_starts_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.endpoint.wait_for(1, WAIT)
            await run.send("ticket=ticket-1!callback@help.example", ANN, body="phone: 2\n")
            entries = await run.thread(1)
            assert len([e for e in entries if e["kind"] == "contract.out"]) == 1
            assert [e.get("requested_mode") for e in entries if e["kind"] == "mail.in"] == [
                "callback",
                "callback",
            ]
            (handoff,) = (await run.case(1))["handoffs"]
            assert handoff["handoff_id"] == request.json["handoff_id"]
            assert handoff["status"] == "requested"
            await run.sink.wait_for(1, WAIT)  # the acknowledgement only
            assert len(await run.kinds(1, "mail.out")) == 1
            assert len(run.endpoint.requests) == 1

    asyncio.run(main())


# --------------------------------------------------------------------------- time and failures


@pytest.mark.slow
def test_deadline_times_out_cancels_and_resumes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, deadline="2s") as run:
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.endpoint.wait_for(1, WAIT)
            response = await run.post_status(request, 1, "scheduled")
            assert response.status_code == 200, response.text

            await run.wait_thread(
                1,
                lambda es: any(e["kind"] == "status" and e["status"] == "timed-out" for e in es),
                "timed-out",
            )
            _, cancel = await run.endpoint.wait_for(2, WAIT)
            assert cancel.json["type"] == "handoff.cancel"
            assert cancel.json["handoff_id"] == request.json["handoff_id"]
            assert cancel.json["reason"] == "timed-out"
            _, resume = await run.sink.wait_for(2, WAIT)
            assert "in time" in text_of(resume)
            (timed_out,) = [e for e in await run.kinds(1, "status") if e["status"] == "timed-out"]
            assert timed_out["source"] == "email"
            # docs/protocol.md §12: a later status with a new seq is an invalid transition.
            late = await run.post_status(request, 2, "running")
            assert late.status_code == 409
            assert late.json()["error"] == "invalid-transition"

    asyncio.run(main())


@pytest.mark.slow
def test_request_refused_with_400_fails_and_resumes(tmp_path: Path) -> None:
    async def main() -> None:
        peer = FakePeer([(400, {"ok": False, "error": "invalid-message", "detail": "no"})])
        async with running(tmp_path, endpoint=peer) as run:
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            entries = await run.wait_thread(
                1,
                lambda es: any(e["kind"] == "status" and e["status"] == "failed" for e in es),
                "failed",
            )
            (failed,) = [e for e in entries if e["kind"] == "status" and e["status"] == "failed"]
            assert failed["source"] == "email"
            assert "400" in failed["detail"]
            assert [e["kind"] for e in entries].count("delivery.failed") == 1
            _, resume = await run.sink.wait_for(2, WAIT)
            assert "could not be carried out" in text_of(resume)
            assert len(run.endpoint.requests) == 1  # a 4xx is not retried

    asyncio.run(main())


@pytest.mark.slow
def test_request_answered_503_is_retried_with_the_same_id(tmp_path: Path) -> None:
    async def main() -> None:
        peer = FakePeer([(503, {"ok": False, "error": "busy", "detail": "later"})])
        async with running(tmp_path, endpoint=peer) as run:
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            first, second = await run.endpoint.wait_for(2, WAIT)
            assert first.json["type"] == second.json["type"] == "handoff.request"
            assert first.json == second.json  # same id, same message
            (handoff,) = (await run.case(1))["handoffs"]
            assert handoff["status"] == "requested"
            assert not await run.kinds(1, "delivery.failed")
            response = await run.post_status(first, 1, "running")
            assert response.status_code == 200, response.text

    asyncio.run(main())


# --------------------------------------------------------------------------- the process


@pytest.mark.slow
def test_restart_after_kill_resumes_pending_work_once(tmp_path: Path) -> None:
    async def main() -> None:
        endpoint_up = asyncio.Event()
        accepted: list[Recorded] = []

        def script(rec: Recorded) -> tuple[int, Any]:
            if not endpoint_up.is_set():
                return 503, {"ok": False, "error": "down", "detail": "down"}
            accepted.append(rec)
            return 200, {"ok": True}

        async with running(tmp_path, endpoint=FakePeer(script)) as run:
            # Case 1: its acknowledgement is sent (the relay said 250) before the crash.
            await run.send("ticket@help.example", BOB)
            (bob_ack,) = await run.sink.wait_for(1, WAIT)
            # Case 2: the relay is down and the endpoint answers 503: both stay pending.
            await run.sink.set_down(True)
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            await run.endpoint.wait_for(1, WAIT)

            run.masd.kill()  # kill -9: nothing is flushed or finished
            endpoint_up.set()
            await run.sink.set_down(False)
            await run.masd.start()

            ann_ack = (await run.sink.wait_for(2, WAIT))[1]
            assert ann_ack.rcpt_tos == (ANN,)
            await wait_until(lambda: bool(accepted), "the endpoint accepted handoff.request")
            requests = run.endpoint.requests
            assert {r.json["type"] for r in requests} == {"handoff.request"}
            assert len({r.json["id"] for r in requests}) == 1  # every attempt: the same id
            assert len(accepted) == 1

            # One more mail on each case: each case's mail queue is delivered in
            # order, so an acknowledgement sent again would arrive before these.
            response = await run.post_status(requests[-1], 1, "running")
            assert response.status_code == 200, response.text
            response = await run.post_status(requests[-1], 2, "completed")
            assert response.status_code == 200, response.text
            await run.send("ticket=ticket-1!chat@help.example", BOB)
            mails = await run.sink.wait_for(4, WAIT)
            assert len(mails) == 4
            assert [m.rcpt_tos for m in mails].count((BOB,)) == 2
            assert [m.rcpt_tos for m in mails].count((ANN,)) == 2
            sent_ids = [m.message["Message-ID"] for m in mails]
            assert sent_ids.count(bob_ack.message["Message-ID"]) == 1
            # The accepted handoff.request was not sent again.
            assert len(accepted) == 1
            (handoff,) = (await run.case(2))["handoffs"]
            assert handoff["status"] == "completed"

    asyncio.run(main())


@pytest.mark.slow
def test_sigterm_exits_zero(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            await run.send("ticket@help.example", ANN)
            await run.sink.wait_for(1, WAIT)
            assert await run.masd.terminate() == 0
            assert not run.masd.running

    asyncio.run(main())


# --------------------------------------------------------------------------- LMTP replies


@pytest.mark.slow
def test_one_transaction_many_recipients_mixed_outcomes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            rcpts = [
                "ticket@help.example",  # intake: accepted
                "ticket=ticket-99@help.example",  # no such case
                "ticket@elsewhere.example",  # not a configured domain
                "nosuchtype@help.example",  # unknown type
                "ticket!callback@help.example",  # intake and a handoff: accepted
                "TICKET+tag@Help.Example",  # delimiter suffix and case: accepted
            ]
            _, data = make_mail(ANN, "ticket@help.example", body="phone: 1\n")
            result = await run.deliver(rcpts, ANN, data)
            codes = result.codes
            assert codes == (250, 550, 550, 550, 250, 250), result
            enhanced = [r.final.enhanced for r in result.recipients]
            assert enhanced == ["2.0.0", "5.1.1", "5.1.2", "5.1.1", "2.0.0", "2.0.0"]
            # Each accepted recipient opened its own case; the refused ones nothing.
            for n in (1, 2, 3):
                assert (await run.case(n))["participant"] == ANN
            assert await run.case_status(4) == 404
            (request,) = await run.endpoint.wait_for(1, WAIT)
            assert request.json["case"]["address"] in {case_address(n) for n in (1, 2, 3)}
            await run.sink.wait_for(3, WAIT)

    asyncio.run(main())


@pytest.mark.slow
def test_no_log_line_prints_none_for_an_absent_value(tmp_path: Path) -> None:
    """masd's own statuses (requested, timed-out) have no seq: the line says ``seq=-``."""

    async def main() -> str:
        async with running(tmp_path, deadline="2s") as run:
            await run.send("ticket!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.endpoint.wait_for(1, WAIT)
            response = await run.post_status(request, 1, "scheduled")
            assert response.status_code == 200, response.text
            await run.wait_thread(
                1,
                lambda es: any(e["kind"] == "status" and e["status"] == "timed-out" for e in es),
                "timed-out",
            )
            await run.endpoint.wait_for(2, WAIT)  # the cancel
            await run.sink.wait_for(2, WAIT)  # the acknowledgement and the resume mail
            return run.masd.log()

    log = asyncio.run(main())
    statuses = [line for line in log.splitlines() if " status case=" in line]
    # The mode's status is logged on its HTTP message's line; these two masd recorded.
    seqs = [
        (line.partition(" status=")[2].split()[0], line.partition(" seq=")[2].split()[0])
        for line in statuses
    ]
    assert seqs == [("requested", "-"), ("timed-out", "-")], statuses
    assert all(f"case={case_address(1)}" in line for line in statuses), statuses
    assert [line for line in log.splitlines() if "=None" in line] == []
