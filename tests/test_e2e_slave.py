"""Black-box runs of the slave role (docs/protocol.md §13, §8, §4.4; docs/protocol.md §3, §4, §9,
§13, §18).

masd runs as a real process with a configuration written by
:func:`support.slave.write_slave_config`.  Everything is on loopback: mail
goes in over LMTP, the outside master and the transfers webhook are
:class:`~masd.testing.peers.FakePeer` servers, the SMTP relay is an
:class:`~masd.testing.peers.SmtpSink`, and the test plays the master and the
webhook by POSTing contract messages to masd with their secrets.  What masd
recorded is read back through the HTTP read side (docs/protocol.md §16).

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema
import pytest
from support.masd_process import ROOT, WAIT, MasdProcess, mx_mail, wait_until
from support.slave import OTHER_DOMAIN, SlaveSetup, write_slave_config

from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, ReceivedMail, Recorded, SmtpSink

ANN = "ann@example.org"
BOB = "bob@example.net"
INTAKE = "case@help.example"

EVENT_SCHEMA = jsonschema.Draft202012Validator(
    json.loads((ROOT / "conformance" / "schema" / "mas-event-v0.1.schema.json").read_text("utf-8"))
)


def ref(resource_id: str, domain: str = "help.example") -> dict[str, str]:
    """The envelope's ``case`` for ``case=<resource_id>@<domain>`` (docs/protocol.md §2)."""
    return {
        "address": f"case={resource_id}@{domain}",
        "key": f"case={resource_id.casefold()}@{domain}",
    }


# --------------------------------------------------------------------------- mail


make_mail = mx_mail


def text_of(mail: ReceivedMail) -> str:
    part = mail.message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


# --------------------------------------------------------------------------- the harness


@dataclass
class Run:
    """One masd process with its master, webhook and relay, and the ways a test talks to them."""

    setup: SlaveSetup
    masd: MasdProcess
    master: FakePeer
    webhook: FakePeer
    sink: SmtpSink
    http: httpx.AsyncClient  # the read side, with the admin secret

    # ---- mail in

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

    # ---- what masd sent

    def sent(self, peer: FakePeer, mtype: str) -> list[dict[str, Any]]:
        """Every message of ``mtype`` ``peer`` received (retries included), in order."""
        return [r.json for r in peer.requests if r.json and r.json.get("type") == mtype]

    async def wait_sent(self, peer: FakePeer, mtype: str, n: int) -> list[dict[str, Any]]:
        """Wait until ``peer`` has received ``n`` messages of ``mtype``; returns them all."""
        await wait_until(lambda: len(self.sent(peer, mtype)) >= n, f"{n} x {mtype}")
        return self.sent(peer, mtype)

    async def intake(self, rcpt: str, sender: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        """Deliver an intake mail; returns its Message-ID and the case.intake the master got."""
        before = len({m["id"] for m in self.sent(self.master, "case.intake")})
        message_id = await self.send(rcpt, sender, **kw)
        await wait_until(
            lambda: len({m["id"] for m in self.sent(self.master, "case.intake")}) > before,
            "case.intake",
        )
        for message in self.sent(self.master, "case.intake"):
            if message["event"]["message_id"] == message_id:
                return message_id, message
        raise AssertionError(f"no case.intake for {message_id}")

    # ---- contract messages to masd

    async def post(
        self, mtype: str, *, token: str | None = None, mid: str | None = None, **payload: Any
    ) -> httpx.Response:
        """POST a contract message to masd, as the master unless ``token`` says otherwise."""
        message = {
            "mas_modes_version": "0.1",
            "type": mtype,
            "id": mid or secrets.token_hex(16),
            **payload,
        }
        return await self.http.post(
            "/mas/v0.1/messages",
            json=message,
            headers={"Authorization": f"Bearer {token or self.setup.master_token}"},
        )

    async def assign(
        self, intake_ref: str, resource_id: str, policy: dict[str, Any] | None = None, **kw: Any
    ) -> httpx.Response:
        extra: dict[str, Any] = {} if policy is None else {"policy": policy}
        return await self.post(
            "case.assign", intake_ref=intake_ref, resource_id=resource_id, **extra, **kw
        )

    async def open_case(
        self, resource_id: str, sender: str = ANN, policy: dict[str, Any] | None = None, **kw: Any
    ) -> dict[str, Any]:
        """An intake mail to ``case@D`` assigned ``resource_id``; returns its case.intake."""
        _, message = await self.intake(INTAKE, sender, **kw)
        response = await self.assign(message["intake_ref"], resource_id, policy)
        assert response.status_code == 200, response.text
        return message

    async def policy(self, resource_id: str, **fields: Any) -> httpx.Response:
        return await self.post("case.policy", case=ref(resource_id), **fields)

    async def mail_send(self, resource_id: str, in_reply_to: str, **kw: Any) -> httpx.Response:
        kw.setdefault("body", "Thanks, we are on it.\n")
        return await self.post("mail.send", case=ref(resource_id), in_reply_to=in_reply_to, **kw)

    async def post_status(
        self,
        request: dict[str, Any],
        seq: int,
        status: str,
        *,
        token: str | None = None,
        **fields: Any,
    ) -> httpx.Response:
        """POST ``handoff.status`` for the handoff of ``request``, as the webhook."""
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": secrets.token_hex(16),
            "case": request["case"],
            "handoff_id": request["handoff_id"],
            "seq": seq,
            "status": status,
            **fields,
        }
        return await self.http.post(
            request["status_url"],
            json=message,
            headers={"Authorization": f"Bearer {token or self.setup.webhook_token}"},
        )

    # ---- the read side

    async def case(self, resource_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/mas/v0.1/cases/{quote(ref(resource_id)['key'], safe='')}")
        assert response.status_code == 200, response.text
        doc: dict[str, Any] = response.json()["case"]
        return doc

    async def case_status(self, key: str) -> int:
        return (await self.http.get(f"/mas/v0.1/cases/{quote(key, safe='')}")).status_code

    async def thread(self, resource_id: str) -> list[dict[str, Any]]:
        path = f"/mas/v0.1/cases/{quote(ref(resource_id)['key'], safe='')}/thread"
        response = await self.http.get(path, params={"limit": 1000})
        assert response.status_code == 200, response.text
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    async def kinds(self, resource_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in await self.thread(resource_id) if e["kind"] == kind]


@asynccontextmanager
async def running(
    tmp_path: Path, *, master: FakePeer | None = None, **config: Any
) -> AsyncIterator[Run]:
    """masd in the slave role with a fake master, a fake webhook and a mail sink.

    ``transfers="webhook"`` makes the fake webhook the type's default transfer.
    """
    async with master or FakePeer() as crm, FakePeer() as hook, SmtpSink() as sink:
        if config.get("transfers") == "webhook":
            config["transfers"] = hook.url + "hooks/"
        setup = write_slave_config(
            tmp_path / "masd",
            master_url=crm.url + "crm",
            webhook_url=hook.url + "hooks/",
            smtp_port=sink.port,
            **config,
        )
        async with (
            MasdProcess(setup.config, tmp_path / "masd.log") as masd,
            httpx.AsyncClient(
                base_url=setup.http_url,
                headers={"Authorization": f"Bearer {setup.admin_token}"},
                timeout=WAIT,
            ) as http,
        ):
            yield Run(setup, masd, crm, hook, sink, http)
            if masd.running:
                code = await masd.terminate()
                assert code == 0, masd.log()


def refusal(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert body["ok"] is False, body
    assert body["detail"], body
    return response.status_code, body["error"]


# --------------------------------------------------------------------------- intake and assignment


@pytest.mark.slow
def test_intake_is_reported_and_no_id_is_invented(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            plain_id, plain = await run.intake(INTAKE, ANN, subject="My order")
            _, asked = await run.intake("case!callback@help.example", BOB, body="phone: 1\n")
            for message, mode in ((plain, None), (asked, "callback")):
                assert message["mas_modes_version"] == "0.1"
                assert "case" not in message  # docs/protocol.md §7: absent only in case.intake
                assert message["resource_type"] == "case"
                assert message["requested_mode"] == mode  # docs/protocol.md §13: null when none
                assert message["intake_ref"]
                EVENT_SCHEMA.validate(message["event"])
            assert plain["intake_ref"] != asked["intake_ref"]
            assert plain["event"]["message_id"] == plain_id
            assert plain["event"]["from"]["address"] == ANN
            assert plain["event"]["rcpt_to"] == INTAKE
            assert plain["event"]["subject"] == "My order"
            (request,) = [r for r in run.master.requests if r.json["id"] == plain["id"]]
            assert request.path == "/crm"
            assert request.headers["authorization"] == f"Bearer {run.setup.master_token}"

            # docs/protocol.md §3: the same message delivered again is recorded (and reported) once.
            again_id, again_data = make_mail(ANN, INTAKE, subject="Twice")
            for _ in range(2):
                assert (await run.deliver([INTAKE], ANN, again_data)).codes == (250,)
            await run.wait_sent(run.master, "case.intake", 3)

            # Email MUST NOT invent case identifiers: nothing exists before case.assign.
            _, data = make_mail(ANN, "case=case-1@help.example")
            unassigned = [
                "case=case-1@help.example",
                "case=anything@help.example",
                "case=case-1!callback@help.example",
            ]
            result = await run.deliver(unassigned, ANN, data)
            assert result.codes == (550, 550, 550), result
            assert [r.final.enhanced for r in result.recipients] == ["5.1.1"] * 3
            assert await run.case_status("case=case-1@help.example") == 404
            assert run.sent(run.master, "case.message") == []
            assert run.sink.messages == []
            intakes = run.sent(run.master, "case.intake")
            assert [m["event"]["message_id"] for m in intakes].count(again_id) == 1
            assert len({m["intake_ref"] for m in intakes}) == len(intakes) == 3

    asyncio.run(main())


@pytest.mark.slow
def test_assign_adopts_the_masters_id_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            message_id, intake = await run.intake(INTAKE, ANN, subject="Broken printer")
            intake_ref = intake["intake_ref"]

            unknown = await run.assign("intake-does-not-exist", "CRM-1001")
            assert refusal(unknown) == (404, "unknown-intake")

            # docs/protocol.md §2: the id grammar, and type=id at most 47 octets.
            for bad in ("has space", ".lead", "trail.", "a..b", "ü", "x" * 43, "x" * 65, ""):
                response = await run.assign(intake_ref, bad)
                assert refusal(response) == (400, "invalid-message"), bad
                assert "resource_id" in response.json()["detail"], response.text
            # A master of another type or domain may not assign this intake (docs/protocol.md §9).
            other = await run.assign(intake_ref, "CRM-1001", token=run.setup.other_master_token)
            assert refusal(other) == (403, "forbidden")
            # docs/protocol.md §9: a bad message is 400 before it is someone else's (403).
            other_bad = await run.assign(intake_ref, "a..b", token=run.setup.other_master_token)
            assert refusal(other_bad) == (400, "invalid-message")
            # Only a master sends case.assign.
            hooked = await run.assign(intake_ref, "CRM-1001", token=run.setup.webhook_token)
            assert refusal(hooked) == (403, "forbidden")
            assert await run.case_status(ref("CRM-1001")["key"]) == 404

            first = await run.assign(intake_ref, "CRM-1001", mid="assign-1")
            assert first.status_code == 200, first.text
            assert first.json() == {"ok": True, "case": ref("CRM-1001")}
            # The same message again: the original answer (docs/protocol.md §7).
            again = await run.assign(intake_ref, "CRM-1001", mid="assign-1")
            assert (again.status_code, again.json()) == (200, first.json())
            # The same assignment in a new message (any spelling of the id): ok; another id: 409.
            same = await run.assign(intake_ref, "crm-1001")
            assert (same.status_code, same.json()) == (200, first.json())
            moved = await run.assign(intake_ref, "CRM-2002")
            assert refusal(moved) == (409, "already-assigned")
            assert await run.case_status(ref("CRM-2002")["key"]) == 404

            case = await run.case("CRM-1001")
            assert case["address"] == "case=CRM-1001@help.example"
            assert case["key"] == "case=crm-1001@help.example"
            assert case["role"] == "slave"
            assert case["participant"] == ANN
            assert case["handoffs"] == []
            # docs/protocol.md §13: the intake's message is the case's first message.
            (first_in,) = await run.kinds("CRM-1001", "mail.in")
            assert first_in["message_ref"] == intake["event"]["message_ref"]
            assert first_in["intake_ref"] == intake_ref

            # The longest id that fits: type=id of 47 octets (docs/protocol.md §2).
            _, long_intake = await run.intake(INTAKE, BOB)
            longest = "u" * 42
            response = await run.assign(long_intake["intake_ref"], longest)
            assert response.status_code == 200, response.text
            assert len(f"case={longest}!" + "m" * 16) == 64

            # Another intake may be assigned to an existing case: its mail joins the case,
            # whose address keeps the spelling it was adopted with and its participant.
            _, joining = await run.intake(INTAKE, "carol@example.com")
            joined = await run.assign(joining["intake_ref"], "crm-1001")
            assert (joined.status_code, joined.json()) == (200, first.json())
            assert (await run.case("CRM-1001"))["participant"] == ANN
            assert [e["message_ref"] for e in await run.kinds("CRM-1001", "mail.in")] == [
                intake["event"]["message_ref"],
                joining["event"]["message_ref"],
            ]

            # After assignment: mail on the case (any case spelling) is case.message.
            reply_id = await run.send(
                "CASE=Crm-1001@Help.Example",
                ANN,
                subject="Re: Broken printer",
                in_reply_to=message_id,
                body="It still jams.\n",
            )
            (message,) = await run.wait_sent(run.master, "case.message", 1)
            assert message["case"] == ref("CRM-1001")
            EVENT_SCHEMA.validate(message["event"])
            assert message["message_ref"] == message["event"]["message_ref"]
            assert message["event"]["message_id"] == reply_id
            assert message["event"]["in_reply_to"] == message_id
            assert message["event"]["text"].strip() == "It still jams."
            assert [e["message_ref"] for e in await run.kinds("CRM-1001", "mail.in")] == [
                intake["event"]["message_ref"],
                joining["event"]["message_ref"],
                message["message_ref"],
            ]
            # A case of the other type is still unknown; the intake answered nothing by mail.
            _, data = make_mail(ANN, "order=CRM-1001@help.example")
            result = await run.deliver(["order=CRM-1001@help.example"], ANN, data)
            assert result.codes == (550,)
            assert run.sink.messages == []
            assert run.webhook.requests == []

    asyncio.run(main())


# --------------------------------------------------------------------------- mail.send


@pytest.mark.slow
def test_mail_send_replies_to_the_sender_of_the_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, per_case=3) as run:
            message_id, intake = await run.intake(INTAKE, ANN, subject="Broken printer")
            # Nothing can answer the intake before it is a case.
            early = await run.mail_send("CRM-1", intake["event"]["message_ref"])
            assert refusal(early) == (404, "unknown-case")
            assert (await run.assign(intake["intake_ref"], "CRM-1")).status_code == 200

            sent = await run.mail_send("CRM-1", intake["event"]["message_ref"], body="On it.\n")
            assert (sent.status_code, sent.json()) == (200, {"ok": True, "sent": True})
            (mail,) = await run.sink.wait_for(1, WAIT)
            msg = mail.message
            assert mail.rcpt_tos == (ANN,)
            assert email.utils.parseaddr(msg["From"])[1] == "case=CRM-1@help.example"
            assert email.utils.parseaddr(msg["To"])[1] == ANN
            assert msg["In-Reply-To"] == message_id
            assert message_id in msg["References"]
            assert (
                msg["Subject"] == "Re: Broken printer"
            )  # docs/protocol.md §9: the default subject
            assert (
                msg["Auto-Submitted"] is None
            )  # docs/protocol.md §5: none on a master's mail.send
            assert text_of(mail).strip() == "On it."

            # A later message on the case, from someone else: the reply goes to its sender,
            # never to Reply-To (docs/protocol.md §4).
            carl = "carl@example.com"
            carl_id = await run.send(
                "case=CRM-1@help.example", carl, headers={"Reply-To": "victim@example.net"}
            )
            (carl_msg,) = await run.wait_sent(run.master, "case.message", 1)
            sent = await run.mail_send(
                "CRM-1", carl_msg["message_ref"], subject="Your question", body="Hi Carl.\n"
            )
            assert sent.status_code == 200, sent.text
            _, to_carl = await run.sink.wait_for(2, WAIT)
            assert to_carl.rcpt_tos == (carl,)
            assert to_carl.message["In-Reply-To"] == carl_id
            assert to_carl.message["Subject"] == "Your question"
            assert to_carl.message["Auto-Submitted"] is None

            # Refusals (docs/protocol.md §8, §4.4): 422 with the reason, recorded, nothing sent.
            await run.send("case=CRM-1@help.example", BOB, dmarc="fail")
            await run.send(
                "case=CRM-1@help.example", "robot@shop.example", headers={"Precedence": "bulk"}
            )
            await run.send(
                "case=CRM-1@help.example",
                "daemon@shop.example",
                headers={"Auto-Submitted": "auto-generated"},
            )
            _, bounce = make_mail("mailer-daemon@shop.example", "case=CRM-1@help.example")
            assert (await run.deliver(["case=CRM-1@help.example"], "", bounce)).codes == (250,)
            _, unauthenticated, bulk, auto, null = await run.wait_sent(
                run.master, "case.message", 5
            )
            assert null["event"]["mail_from"] == ""
            other_case = await run.open_case("CRM-2", sender=BOB)
            expected = [
                (unauthenticated["message_ref"], "unauthenticated-sender"),
                (bulk["message_ref"], "automated-sender"),
                (auto["message_ref"], "automated-sender"),
                (null["message_ref"], "automated-sender"),  # the null sender
                ("msg-no-such-message", "unknown-message"),
                # A message of another case is not a message of this one.
                (other_case["event"]["message_ref"], "unknown-message"),
            ]
            for message_ref, reason in expected:
                response = await run.mail_send("CRM-1", message_ref)
                assert response.status_code == 422, response.text
                body = response.json()
                assert (body["ok"], body["error"], body["reason"]) == (False, "refused", reason)
                assert body["detail"]

            # The send cap (per_case = 3): the third mail goes out, the fourth is refused.
            third = await run.mail_send("CRM-1", intake["event"]["message_ref"])
            assert third.status_code == 200, third.text
            capped = await run.mail_send("CRM-1", intake["event"]["message_ref"])
            assert capped.status_code == 422, capped.text
            assert capped.json()["reason"] == "send-cap-reached"
            # The other case has its own count.
            other = await run.mail_send("CRM-2", other_case["event"]["message_ref"])
            assert other.status_code == 200, other.text

            mails = await run.sink.wait_for(4, WAIT)
            assert [m.rcpt_tos for m in mails] == [(ANN,), (carl,), (ANN,), (BOB,)]
            refused = [
                (e["reason"], e["purpose"]) for e in await run.kinds("CRM-1", "mail.refused")
            ]
            assert refused == [
                ("unauthenticated-sender", "reply"),
                ("automated-sender", "reply"),
                ("automated-sender", "reply"),
                ("automated-sender", "reply"),
                ("unknown-message", "reply"),
                ("unknown-message", "reply"),
                ("send-cap-reached", "reply"),
            ]
            assert len(await run.kinds("CRM-1", "mail.out")) == 3
            assert (await run.case("CRM-1"))["sent"] == 3

            # Bad input is refused by name: a missing body, a case of another master.
            no_body = await run.post(
                "mail.send", case=ref("CRM-1"), in_reply_to=intake["event"]["message_ref"]
            )
            assert refusal(no_body) == (400, "invalid-message")
            assert "body" in no_body.json()["detail"]
            foreign = await run.mail_send(
                "CRM-2", other_case["event"]["message_ref"], token=run.setup.other_master_token
            )
            assert refusal(foreign) == (403, "forbidden")

            # "sent" means durably queued: with the relay down the mail waits, then goes.
            # A caller's subject never adds a header (docs/protocol.md §5).
            await run.sink.set_down(True)
            queued = await run.mail_send(
                "CRM-2",
                other_case["event"]["message_ref"],
                subject="Hello\r\nBcc: victim@example.net",
                body="Second answer.\n",
            )
            assert (queued.status_code, queued.json()) == (200, {"ok": True, "sent": True})
            await run.sink.set_down(False)
            late = (await run.sink.wait_for(5, WAIT))[4]
            assert late.rcpt_tos == (BOB,)
            assert late.message["Bcc"] is None
            assert late.message["Subject"] == "Hello Bcc: victim@example.net"
            assert text_of(late).strip() == "Second answer."
            assert len(await run.kinds("CRM-1", "mail.out")) == 3

    asyncio.run(main())


# --------------------------------------------------------------------------- policy and transfers


@pytest.mark.slow
def test_policy_changes_only_the_fields_it_carries(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            hooks = run.setup.webhook_url  # http://127.0.0.1:PORT/hooks/
            block = {"autonomous_send": False, "transfers": "block"}
            await run.open_case("CRM-1")
            assert (await run.case("CRM-1"))["policy"] == block  # the type's defaults

            steps: list[tuple[dict[str, Any], dict[str, Any]]] = [
                ({"transfers": {"webhook": hooks + "callback"}}, {"transfers": hooks + "callback"}),
                ({"autonomous_send": True}, {"autonomous_send": True}),
                ({}, {}),
                ({"transfers": "block"}, {"transfers": "block"}),
                ({"transfers": {"webhook": hooks}, "autonomous_send": False}, {"transfers": hooks}),
            ]
            policy = dict(block)
            for fields, change in steps:
                response = await run.policy("CRM-1", **fields)
                assert (response.status_code, response.json()) == (200, {"ok": True}), fields
                policy.update(change)
                if "autonomous_send" in fields:
                    policy["autonomous_send"] = fields["autonomous_send"]
                assert (await run.case("CRM-1"))["policy"] == policy, fields

            # docs/protocol.md §18: only under a configured webhooks url: same scheme, host and
            # port, a path under its path at a "/" boundary.
            port = hooks.split(":")[2].split("/")[0]
            outside = [
                f"http://127.0.0.1:{int(port) + 1}/hooks/",
                f"http://localhost:{port}/hooks/",
                f"https://127.0.0.1:{port}/hooks/",
                f"http://127.0.0.1:{port}/hooksx",
                f"http://127.0.0.1:{port}/",
                f"http://127.0.0.1:{port}/hooks/../admin",
                f"http://127.0.0.1:{port}/hooks/%2e%2e/admin",
                f"http://user:pw@127.0.0.1:{port}/hooks/",
                "http://203.0.113.9/hooks/",
            ]
            for url in outside:
                response = await run.policy("CRM-1", transfers={"webhook": url})
                assert refusal(response) == (400, "invalid-message"), url
                assert "transfers.webhook" in response.json()["detail"], response.text
            for bad in ("forward", {"url": hooks}, {"webhook": 7}):
                response = await run.policy("CRM-1", transfers=bad)
                assert refusal(response) == (400, "invalid-message"), bad
            bad_flag = await run.policy("CRM-1", autonomous_send="yes")
            assert refusal(bad_flag) == (400, "invalid-message")
            assert (await run.case("CRM-1"))["policy"] == policy  # none of them changed it

            # case.assign's policy: the same check; the intake stays pending when refused.
            _, intake = await run.intake(INTAKE, BOB)
            refused = await run.assign(
                intake["intake_ref"], "CRM-2", {"transfers": {"webhook": outside[0]}}
            )
            assert refusal(refused) == (400, "invalid-message")
            assert "policy.transfers.webhook" in refused.json()["detail"]
            assert await run.case_status(ref("CRM-2")["key"]) == 404
            assigned = await run.assign(intake["intake_ref"], "CRM-2", {"autonomous_send": True})
            assert assigned.status_code == 200, assigned.text
            assert (await run.case("CRM-2"))["policy"] == {
                "autonomous_send": True,
                "transfers": "block",
            }

            # Only the case's own master sets its policy; an unknown case is 404.
            foreign = await run.post(
                "case.policy",
                case=ref("CRM-1"),
                autonomous_send=False,
                token=run.setup.other_master_token,
            )
            assert refusal(foreign) == (403, "forbidden")
            nowhere = await run.policy("CRM-404", autonomous_send=True)
            assert refusal(nowhere) == (404, "unknown-case")
            elsewhere = await run.post(
                "case.policy",
                case=ref("CRM-1", OTHER_DOMAIN),
                autonomous_send=True,
                token=run.setup.other_master_token,
            )
            assert refusal(elsewhere) == (404, "unknown-case")
            assert (await run.case("CRM-1"))["policy"] == policy

    asyncio.run(main())


@pytest.mark.slow
def test_block_reports_handoff_requested_not_forwarded(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            # A mode asked for in the intake mail, handled once the case exists.
            _, intake = await run.intake("case!callback@help.example", ANN, body="phone: 1\n")
            assert run.sent(run.master, "handoff.requested") == []
            assert (await run.assign(intake["intake_ref"], "CRM-1")).status_code == 200
            (requested,) = await run.wait_sent(run.master, "handoff.requested", 1)
            assert requested["case"] == ref("CRM-1")
            assert requested["mode"] == "callback"
            assert requested["forwarded"] is False
            assert requested["handoff_id"]

            # On an existing case: the mail is a case.message, the mode a handoff.requested.
            await run.send("case=CRM-1!chat@help.example", ANN)
            (message,) = await run.wait_sent(run.master, "case.message", 1)
            _, chat = await run.wait_sent(run.master, "handoff.requested", 2)
            assert (chat["mode"], chat["forwarded"]) == ("chat", False)
            assert chat["handoff_id"] != requested["handoff_id"]
            assert message["event"]["rcpt_to"] == "case=CRM-1!chat@help.example"

            # "... and nothing else happens": no request anywhere, no mail, no handoff.
            case = await run.case("CRM-1")
            assert case["handoffs"] == []
            assert not await run.kinds("CRM-1", "status")
            assert run.webhook.requests == []
            assert run.sink.messages == []
            kinds = [e["kind"] for e in await run.thread("CRM-1")]
            assert "mail.out" not in kinds
            assert "mail.refused" not in kinds
            sent_types = [m["type"] for m in (r.json for r in run.master.requests)]
            assert sent_types == [
                "case.intake",
                "handoff.requested",
                "case.message",
                "handoff.requested",
            ]

    asyncio.run(main())


@pytest.mark.slow
def test_type_defaults_apply_until_the_master_overrides_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, autonomous_send=True, transfers="webhook") as run:
            hooks = run.setup.webhook_url
            # No policy in case.assign: the type's defaults (autonomous, the webhook).
            ann_id, ann = await run.intake(
                "case!callback@help.example", ANN, subject="Call me", body="phone: +1 555 0100\n"
            )
            assert run.webhook.requests == []  # nothing before the case exists
            assert (await run.assign(ann["intake_ref"], "CRM-1")).status_code == 200
            assert (await run.case("CRM-1"))["policy"] == {
                "autonomous_send": True,
                "transfers": hooks,
            }
            (request,) = await run.webhook.wait_for(1, WAIT)
            assert request.json["type"] == "handoff.request"
            assert request.json["case"] == ref("CRM-1")
            (requested,) = await run.wait_sent(run.master, "handoff.requested", 1)
            assert requested["forwarded"] is True
            assert requested["handoff_id"] == request.json["handoff_id"]
            # autonomous_send: email acknowledges by itself (Auto-Submitted, docs/protocol.md §5).
            (ack,) = await run.sink.wait_for(1, WAIT)
            assert ack.rcpt_tos == (ANN,)
            assert ack.message["Auto-Submitted"] == "auto-replied"
            assert ack.message["In-Reply-To"] == ann_id
            (handoff,) = (await run.case("CRM-1"))["handoffs"]
            assert handoff["deadline_at"] is None  # docs/protocol.md §13.5: no deadline
            assert handoff["forwarded"] is True

            # case.assign's policy overrides only the fields it carries.
            _, bob = await run.intake("case!callback@help.example", BOB, body="phone: 2\n")
            assigned = await run.assign(bob["intake_ref"], "CRM-2", {"transfers": "block"})
            assert assigned.status_code == 200, assigned.text
            assert (await run.case("CRM-2"))["policy"] == {
                "autonomous_send": True,
                "transfers": "block",
            }
            _, blocked = await run.wait_sent(run.master, "handoff.requested", 2)
            assert blocked["case"] == ref("CRM-2")
            assert blocked["forwarded"] is False
            _, bob_ack = await run.sink.wait_for(2, WAIT)
            assert bob_ack.rcpt_tos == (BOB,)
            assert len(run.webhook.requests) == 1

            _, carol = await run.intake(INTAKE, "carol@example.com")
            assigned = await run.assign(carol["intake_ref"], "CRM-3", {"autonomous_send": False})
            assert assigned.status_code == 200, assigned.text
            assert (await run.case("CRM-3"))["policy"] == {
                "autonomous_send": False,
                "transfers": hooks,
            }
            assert not await run.kinds("CRM-3", "mail.out")

    asyncio.run(main())


class SwitchableMaster:
    """A fake master that answers 503 while ``down`` and records what it accepted."""

    def __init__(self) -> None:
        self.down = False
        self.accepted: list[dict[str, Any]] = []
        self.peer = FakePeer(self.answer)

    def answer(self, rec: Recorded) -> tuple[int, Any]:
        if self.down:
            return 503, {"ok": False, "error": "unavailable", "detail": "busy"}
        self.accepted.append(rec.json)
        return 200, {"ok": True}

    def accepted_of(self, mtype: str) -> list[dict[str, Any]]:
        return [m for m in self.accepted if m.get("type") == mtype]


@pytest.mark.slow
def test_webhook_transfer_relays_every_status_in_order_under_retries(tmp_path: Path) -> None:
    async def main() -> None:
        crm = SwitchableMaster()
        async with running(tmp_path, master=crm.peer) as run:
            hooks = run.setup.webhook_url
            await run.open_case("CRM-7", policy={"transfers": {"webhook": hooks + "callback"}})
            await run.send(
                "case=CRM-7!callback@help.example",
                ANN,
                subject="Call me",
                body="Please call.\n\nPhone: +1 555 0100\ntime: noon\n",
            )
            (request,) = await run.webhook.wait_for(1, WAIT)
            assert request.method == "POST"
            assert request.path == "/hooks/callback"
            assert request.headers["authorization"] == f"Bearer {run.setup.webhook_token}"
            body = request.json
            assert body["type"] == "handoff.request"
            assert body["case"] == ref("CRM-7")
            assert body["mode"] == "callback"
            assert body["details"] == {"subject": "Call me", "phone": "+1 555 0100"}
            assert body["status_url"] == run.setup.messages_url
            assert body["participant"] == {"address": ANN}
            assert len(body["handoff_id"]) >= 32
            (requested,) = await run.wait_sent(run.master, "handoff.requested", 1)
            assert requested["handoff_id"] == body["handoff_id"]
            assert (requested["mode"], requested["forwarded"]) == ("callback", True)
            await run.wait_sent(run.master, "case.message", 1)

            # The master is unavailable for a while; the webhook goes on posting.
            crm.down = True
            at = "2030-01-01T10:00:00Z"
            steps: list[tuple[int, str, dict[str, Any]]] = [
                (1, "scheduled", {"at": at}),
                (2, "attempted", {"outcome": "no-answer"}),
                (3, "scheduled", {"at": at}),  # a retry
                (4, "running", {}),
            ]
            for seq, status, fields in steps:
                response = await run.post_status(body, seq, status, **fields)
                assert (response.status_code, response.json()) == (200, {"ok": True})
            stale = await run.post_status(body, 4, "running")
            assert (stale.status_code, stale.json()) == (200, {"ok": True, "ignored": "stale"})
            # docs/protocol.md §13.5: timeouts belong to the master; a mode may not send timed-out.
            timed_out = await run.post_status(body, 5, "timed-out")
            assert refusal(timed_out) == (409, "invalid-transition")
            # Statuses come only from the peer the handoff was sent to.
            as_master = await run.post_status(body, 5, "completed", token=run.setup.master_token)
            assert refusal(as_master) == (403, "forbidden")
            done = await run.post_status(body, 5, "completed", detail="We talked.")
            assert done.status_code == 200, done.text
            steps.append((5, "completed", {"detail": "We talked."}))
            late = await run.post_status(body, 6, "running")
            assert refusal(late) == (409, "invalid-transition")

            def relays() -> list[dict[str, Any]]:
                return run.sent(run.master, "handoff.status")

            await wait_until(lambda: len(relays()) >= 2, "relay attempts while down")
            crm.down = False
            await wait_until(lambda: len(crm.accepted_of("handoff.status")) >= 5, "5 relays")

            accepted = crm.accepted_of("handoff.status")
            envelope = {"mas_modes_version", "type", "id", "case", "handoff_id"}
            assert [
                (m["seq"], m["status"], {k: v for k, v in m.items() if k not in envelope})
                for m in accepted
            ] == [(seq, status, {"seq": seq, "status": status, **f}) for seq, status, f in steps]
            for m in accepted:
                assert m["case"] == ref("CRM-7")
                assert m["handoff_id"] == body["handoff_id"]
            assert len({m["id"] for m in accepted}) == 5
            # Every attempt, retries included, in order: no status overtakes an earlier one.
            attempts = [m["seq"] for m in relays()]
            assert attempts == sorted(attempts)
            assert len(attempts) > 5
            statuses = [r for r in run.master.requests if r.json["type"] == "handoff.status"]
            assert {r.headers["authorization"] for r in statuses} == {
                f"Bearer {run.setup.master_token}"
            }

            recorded = [(e["status"], e["source"]) for e in await run.kinds("CRM-7", "status")]
            assert recorded == [("requested", "email")] + [(s, "mode") for _, s, _ in steps]
            (handoff,) = (await run.case("CRM-7"))["handoffs"]
            assert (handoff["status"], handoff["deadline_at"]) == ("completed", None)
            # The master owns the conversation: no resume mail from email in this role.
            assert run.sink.messages == []
            assert len(run.webhook.requests) == 1

    asyncio.run(main())


@pytest.mark.slow
def test_negotiation_only_with_autonomous_send(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, transfers="webhook") as run:
            await run.open_case("CRM-8", subject="Call me")
            await run.send("case=CRM-8!callback@help.example", ANN, body="Call me, please.\n")
            (request,) = await run.webhook.wait_for(1, WAIT)
            body = request.json
            assert body["details"] == {"subject": "Help, please"}

            # Without autonomous_send: no question, and a reply is only a case.message.
            response = await run.post_status(body, 1, "negotiating", needs=["phone"])
            assert response.status_code == 200, response.text
            (relayed,) = await run.wait_sent(run.master, "handoff.status", 1)
            assert (relayed["status"], relayed["needs"]) == ("negotiating", ["phone"])
            await run.send("case=CRM-8@help.example", ANN, body="phone: +1 555 0111\n")
            messages = await run.wait_sent(run.master, "case.message", 2)
            assert messages[-1]["event"]["text"].strip() == "phone: +1 555 0111"
            assert [r.json["type"] for r in run.webhook.requests] == ["handoff.request"]
            assert run.sink.messages == []
            assert not await run.kinds("CRM-8", "mail.refused")

            # With autonomous_send: email asks, and the participant's reply is an update.
            assert (await run.policy("CRM-8", autonomous_send=True)).status_code == 200
            response = await run.post_status(body, 2, "negotiating", needs=["phone"])
            assert response.status_code == 200, response.text
            (question,) = await run.sink.wait_for(1, WAIT)
            assert question.rcpt_tos == (ANN,)
            assert question.message["Auto-Submitted"] == "auto-replied"
            assert email.utils.parseaddr(question.message["From"])[1] == "case=CRM-8@help.example"
            assert "phone:" in text_of(question).splitlines()
            # Someone else's answer supplies nothing (docs/protocol.md §4).
            await run.send("case=CRM-8@help.example", BOB, body="phone: +1 555 6666\n")
            await run.send(
                "case=CRM-8@help.example",
                ANN,
                subject="Re: " + question.message["Subject"],
                body="phone: +1 555 0199\n\n> phone:\n",
                in_reply_to=question.message["Message-ID"],
            )
            _, update = await run.webhook.wait_for(2, WAIT)
            assert update.json["type"] == "handoff.update"
            assert update.json["handoff_id"] == body["handoff_id"]
            assert update.json["case"] == ref("CRM-8")
            assert update.json["details"] == {"phone": "+1 555 0199"}
            assert update.headers["authorization"] == f"Bearer {run.setup.webhook_token}"
            assert update.path == request.path
            # The master still sees every mail, and every status.
            await run.wait_sent(run.master, "case.message", 4)
            response = await run.post_status(body, 3, "scheduled")
            assert response.status_code == 200, response.text
            relayed_all = await run.wait_sent(run.master, "handoff.status", 3)
            assert [(m["seq"], m["status"]) for m in relayed_all] == [
                (1, "negotiating"),
                (2, "negotiating"),
                (3, "scheduled"),
            ]
            assert len(run.webhook.requests) == 2
            assert len(run.sink.messages) == 1

    asyncio.run(main())


@pytest.mark.slow
def test_master_cancel_is_recorded_and_forwarded(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as run:
            hooks = run.setup.webhook_url
            await run.open_case("CRM-9", policy={"transfers": {"webhook": hooks + "a"}})
            await run.send("case=CRM-9!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.webhook.wait_for(1, WAIT)
            body = request.json
            assert (await run.post_status(body, 1, "scheduled")).status_code == 200
            # docs/protocol.md §13: an open handoff keeps its webhook, whatever the policy says
            # later.
            assert (
                await run.policy("CRM-9", transfers={"webhook": hooks + "b"})
            ).status_code == 200
            assert (await run.policy("CRM-9", transfers="block")).status_code == 200

            cancel = {"case": ref("CRM-9"), "handoff_id": body["handoff_id"], "reason": "solved"}
            foreign = await run.post("handoff.cancel", **cancel, token=run.setup.other_master_token)
            assert refusal(foreign) == (403, "forbidden")
            as_hook = await run.post("handoff.cancel", **cancel, token=run.setup.webhook_token)
            assert refusal(as_hook) == (403, "forbidden")
            unknown = await run.post("handoff.cancel", **(cancel | {"handoff_id": "h-unknown"}))
            assert refusal(unknown) == (404, "unknown-handoff")

            done = await run.post("handoff.cancel", **cancel, mid="cancel-1")
            assert (done.status_code, done.json()) == (200, {"ok": True})
            again = await run.post("handoff.cancel", **cancel, mid="cancel-1")
            assert (again.status_code, again.json()) == (200, {"ok": True})
            _, forwarded = await run.webhook.wait_for(2, WAIT)
            assert forwarded.path == "/hooks/a"
            assert forwarded.headers["authorization"] == f"Bearer {run.setup.webhook_token}"
            assert forwarded.json["type"] == "handoff.cancel"
            assert forwarded.json["case"] == ref("CRM-9")
            assert forwarded.json["handoff_id"] == body["handoff_id"]
            assert forwarded.json["reason"] == "solved"

            statuses = [(e["status"], e["source"]) for e in await run.kinds("CRM-9", "status")]
            assert statuses[-1] == ("cancelled", "email")
            (cancelled,) = [
                e for e in await run.kinds("CRM-9", "status") if e["status"] == "cancelled"
            ]
            assert cancelled["reason"] == "solved"
            (handoff,) = (await run.case("CRM-9"))["handoffs"]
            assert handoff["status"] == "cancelled"

            # Nothing follows a terminal status: not a second cancel, not a status.
            before = await run.kinds("CRM-9", "contract.in")
            second = await run.post("handoff.cancel", **cancel)
            assert refusal(second) == (409, "invalid-transition")
            # A refused message leaves nothing on the thread.
            assert await run.kinds("CRM-9", "contract.in") == before
            late = await run.post_status(body, 2, "running")
            assert refusal(late) == (409, "invalid-transition")

            # A handoff refused on the spot (docs/protocol.md §4: an unauthenticated !MODE) is
            # reported as not forwarded; it is terminal, so a cancel is 409 too.
            assert (await run.policy("CRM-9", transfers={"webhook": hooks})).status_code == 200
            await run.send("case=CRM-9!callback@help.example", ANN, dmarc=None)
            requested = await run.wait_sent(run.master, "handoff.requested", 2)
            assert (requested[-1]["forwarded"], requested[-1]["mode"]) == (False, "callback")
            blocked = await run.post(
                "handoff.cancel", **(cancel | {"handoff_id": requested[-1]["handoff_id"]})
            )
            assert refusal(blocked) == (409, "invalid-transition")
            refused = [e for e in await run.kinds("CRM-9", "status") if e["status"] == "refused"]
            assert [e["reason"] for e in refused] == ["blocked"]
            assert len(run.webhook.requests) == 2

            # After the cancel a new request goes to where the policy now points.
            await run.send("case=CRM-9!callback@help.example", ANN, body="phone: 2\n")
            _, _, fresh = await run.webhook.wait_for(3, WAIT)
            assert fresh.path == "/hooks/"
            assert fresh.json["type"] == "handoff.request"
            assert fresh.json["handoff_id"] != body["handoff_id"]
            assert run.sink.messages == []

    asyncio.run(main())


@pytest.mark.slow
def test_refused_webhook_request_fails_without_mail_and_tells_the_master(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, transfers="webhook", autonomous_send=True) as run:
            run.webhook.answer((400, {"ok": False, "error": "invalid-message", "detail": "no"}))
            await run.open_case("CRM-5")
            await run.sink.wait_for(1, WAIT)  # autonomous_send: an acknowledgement
            await run.send("case=CRM-5!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.webhook.wait_for(1, WAIT)
            (relayed,) = await run.wait_sent(run.master, "handoff.status", 1)
            assert relayed["handoff_id"] == request.json["handoff_id"]
            assert (relayed["seq"], relayed["status"]) == (1, "failed")
            assert "400" in relayed["detail"]
            (failed,) = [e for e in await run.kinds("CRM-5", "status") if e["status"] == "failed"]
            assert failed["source"] == "email"
            assert len(await run.kinds("CRM-5", "delivery.failed")) == 1
            # No resume notice: in this role email mails only acknowledgements and
            # questions by itself (docs/protocol.md §13.3).
            assert [e["purpose"] for e in await run.kinds("CRM-5", "mail.out")] == ["acknowledge"]
            assert len(run.webhook.requests) == 1  # a 4xx is not retried
            (handoff,) = (await run.case("CRM-5"))["handoffs"]
            assert handoff["status"] == "failed"

    asyncio.run(main())


# --------------------------------------------------------------------------- the process


@pytest.mark.slow
def test_restart_delivers_pending_intake_and_relays_once(tmp_path: Path) -> None:
    async def main() -> None:
        crm = SwitchableMaster()
        async with running(tmp_path, master=crm.peer, transfers="webhook") as run:
            await run.open_case("CRM-1")
            await run.send("case=CRM-1!callback@help.example", ANN, body="phone: 1\n")
            (request,) = await run.webhook.wait_for(1, WAIT)
            await wait_until(lambda: bool(crm.accepted_of("handoff.requested")), "requested")

            # The master goes away: two relays and a new intake stay pending.
            crm.down = True
            for seq, status in ((1, "scheduled"), (2, "running")):
                response = await run.post_status(request.json, seq, status)
                assert response.status_code == 200, response.text
            bob_id = await run.send(INTAKE, BOB, subject="Second")
            await wait_until(
                lambda: (
                    bool(run.sent(run.master, "case.intake")[1:])
                    and bool(run.sent(run.master, "handoff.status"))
                ),
                "attempts at the pending intake and relay",
            )

            run.masd.kill()  # kill -9: nothing is flushed or finished
            crm.down = False
            await run.masd.start()

            await wait_until(lambda: len(crm.accepted_of("case.intake")) >= 2, "the intake")
            await wait_until(lambda: len(crm.accepted_of("handoff.status")) >= 2, "the relays")
            intakes = crm.accepted_of("case.intake")
            assert [m["event"]["message_id"] for m in intakes][1] == bob_id
            relays = crm.accepted_of("handoff.status")
            assert [(m["seq"], m["status"]) for m in relays] == [(1, "scheduled"), (2, "running")]

            # One more of each after the restart: anything sent twice would show up first.
            response = await run.post_status(request.json, 3, "completed")
            assert response.status_code == 200, response.text
            await wait_until(lambda: len(crm.accepted_of("handoff.status")) >= 3, "relay 3")
            assigned = await run.assign(intakes[1]["intake_ref"], "CRM-2")
            assert assigned.status_code == 200, assigned.text
            await run.intake(INTAKE, "carol@example.com")
            await wait_until(lambda: len(crm.accepted_of("case.intake")) >= 3, "intake 3")

            ids = [m["id"] for m in crm.accepted]
            assert len(ids) == len(set(ids)), ids  # nothing accepted twice
            assert [m["seq"] for m in crm.accepted_of("handoff.status")] == [1, 2, 3]
            assert len(crm.accepted_of("case.intake")) == 3
            assert [r.json["type"] for r in run.webhook.requests] == ["handoff.request"]
            assert (await run.case("CRM-2"))["participant"] == BOB
            (handoff,) = (await run.case("CRM-1"))["handoffs"]
            assert handoff["status"] == "completed"

    asyncio.run(main())
