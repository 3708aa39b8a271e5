"""masd behind a real Postfix, configured from packaging/postfix/ (issue 6, part 1).

Each test runs a private Postfix instance (:mod:`support.postfix`) in front
of masd as a process (:mod:`support.masd_process`): mail goes in by SMTP
(``smtplib``) to Postfix, which asks masd's policy listener about every
recipient and relays help.example to masd over LMTP through the ``masd``
transport; masd's own mail goes out through Postfix (``server.smtp_relay``)
to Postfix's ``relayhost``, an :class:`~masd.testing.peers.SmtpSink`.  The
mode endpoint is a :class:`~masd.testing.peers.FakePeer`; what masd recorded
is read through the read side.

Postfix needs root; these tests skip without it (fail under
``MASD_REQUIRE_SYSTEM_TESTS``).  Waits are bounded polls of the queue
(``postqueue -j``), the log, the sink or the read side; nothing is timed.
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import json
import secrets
import smtplib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from support.bounces import bounce_case
from support.masd_process import DOMAIN, ROOT, MasdProcess, free_port, write_secret
from support.postfix import MYHOSTNAME, PostfixInstance, require_postfix

from masd.testing.peers import FakePeer, ReceivedMail, SmtpSink

WAIT = 20.0
MILTER_MAX_BYTES = 20_000
ANN = "ann@example.org"  # passes DMARC: our stand-in authenticator says so
MALLORY = "mallory@example.com"  # never authenticated
AUTHENTICATED = "X-Test-Authenticated"


# --------------------------------------------------------------------------- the deployment


@dataclass(frozen=True)
class MasdSetup:
    config: Path
    lmtp_port: int
    http_port: int
    policy_port: int
    admin_token: str
    endpoint_token: str


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def write_masd_config(
    directory: Path,
    *,
    endpoint_url: str,
    smtp_port: int,
    lmtp: int,
    http: int,
    policy: int,
    extra: str = "",
) -> MasdSetup:
    """masd.toml for type ``ticket`` (master) of help.example, with the policy listener;
    ``extra``: more ``[server]`` lines."""
    directory.mkdir(parents=True)
    admin_token = "admin-" + secrets.token_hex(16)
    endpoint_token = "callback-" + secrets.token_hex(16)
    write_secret(directory / "secrets" / "admin.token", admin_token)
    write_secret(directory / "secrets" / "callback.token", endpoint_token)
    (directory / "masd.toml").write_text(f"""\
[server]
lmtp = "127.0.0.1:{lmtp}"
http = "127.0.0.1:{http}"
policy = "127.0.0.1:{policy}"
database = "masd.db"
smtp_relay = "127.0.0.1:{smtp_port}"
trusted_authserv_ids = ["{MYHOSTNAME}"]
admin_token_file = "secrets/admin.token"
hostname = "masd.{DOMAIN}"
{extra}
[domains."{DOMAIN}".types.ticket]
role = "master"
modes = ["callback"]

[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "{endpoint_url}"
token_file = "secrets/callback.token"
deadline = "1h"
fields = ["phone"]
""")
    return MasdSetup(directory / "masd.toml", lmtp, http, policy, admin_token, endpoint_token)


@dataclass
class Deployment:
    postfix: PostfixInstance
    masd: MasdProcess
    setup: MasdSetup
    endpoint: FakePeer
    sink: SmtpSink
    http: httpx.AsyncClient

    async def case(self, address: str) -> httpx.Response:
        return await self.http.get(f"/mas/v0.1/cases/{quote(address, safe='')}")

    async def thread(self, address: str) -> list[dict[str, Any]]:
        path = f"/mas/v0.1/cases/{quote(address, safe='')}/thread"
        response = await self.http.get(path, params={"limit": 1000})
        assert response.status_code == 200, response.text
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    async def wait_thread(
        self, address: str, test: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT
        while True:
            if (await self.case(address)).status_code == 200:
                entries = await self.thread(address)
                if test(entries):
                    return entries
            else:
                entries = []
            if loop.time() > until:
                shown = json.dumps(entries, indent=1)
                raise AssertionError(f"{what}: not in the thread of {address}:\n{shown}")
            await asyncio.sleep(0.05)

    async def wait_queue_empty(self) -> None:
        await self.postfix.wait_queue(lambda q: not q, "Postfix's queue empty")


@asynccontextmanager
async def deployment(tmp_path: Path, *, milter: bool = False) -> AsyncIterator[Deployment]:
    """Postfix in front of masd; with ``milter``, Postfix asks masd's milter listener
    (``smtpd_milters``) instead of its policy listener, and masd's size limit is
    :data:`MILTER_MAX_BYTES`."""
    programs = require_postfix()
    async with FakePeer() as endpoint, SmtpSink() as sink:
        # Postfix's site values name masd's listeners; masd's smtp_relay is
        # Postfix's SMTP port, which the instance picks.
        lmtp, http_port, policy, milter_port = free_ports(4)
        postfix = PostfixInstance(
            masd_lmtp=f"inet:127.0.0.1:{lmtp}",
            masd_policy=f"inet:127.0.0.1:{policy}",
            relay_port=sink.port,
            programs=programs,
        )
        try:
            setup = write_masd_config(
                tmp_path / "masd",
                endpoint_url=endpoint.url + "mas",
                smtp_port=postfix.smtp_port,
                lmtp=lmtp,
                http=http_port,
                policy=policy,
                extra=(
                    f'milter = "127.0.0.1:{milter_port}"\nmax_message_bytes = {MILTER_MAX_BYTES}\n'
                    if milter
                    else ""
                ),
            )
            if milter:
                postfix.postconf(
                    "-e",
                    f"smtpd_milters = inet:127.0.0.1:{milter_port}",
                    "smtpd_recipient_restrictions =",
                )
            await postfix.start()
            async with (
                MasdProcess(setup.config, tmp_path / "masd.log") as masd,
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{setup.http_port}",
                    headers={"Authorization": f"Bearer {setup.admin_token}"},
                    timeout=WAIT,
                ) as http,
            ):
                try:
                    yield Deployment(postfix, masd, setup, endpoint, sink, http)
                except BaseException:
                    print(f"---- Postfix log ({postfix.maillog}) ----\n{postfix.log()}")
                    raise
                if masd.running:
                    code = await masd.terminate()
                    assert code == 0, masd.log()
        finally:
            await postfix.stop()
            postfix.remove()


def run(test: Callable[[], Any]) -> None:
    asyncio.run(test())


# --------------------------------------------------------------------------- mail


def make_mail(
    sender: str,
    to: str,
    *,
    subject: str = "Help, please",
    body: str = "Hello.\n",
    authenticated: bool = True,
    headers: list[tuple[str, str]] | None = None,
    raw_headers: bytes = b"",
) -> tuple[str, bytes]:
    """A mail as a sender's MTA would send it; ``authenticated`` asks our stand-in
    authenticator (tests/support/postfix.py) to write a trusted DMARC pass;
    ``raw_headers`` (CRLF-ended lines) go on top as they are."""
    domain = sender.rsplit("@", 1)[1]
    message_id = f"<{secrets.token_hex(8)}@{domain}>"
    msg = EmailMessage(policy=email.policy.SMTP)
    for name, value in headers or []:
        msg[name] = value
    if authenticated:
        msg[AUTHENTICATED] = f"dmarc=pass header.from={domain}"
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id
    msg.set_content(body)
    return message_id, raw_headers + msg.as_bytes()


def mail_in(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["kind"] == "mail.in"]


def bounces(mails: list[ReceivedMail]) -> list[ReceivedMail]:
    """Delivery status notifications: null envelope sender (RFC 5321 §4.5.5)."""
    return [m for m in mails if m.mail_from in ("", "<>")]


# --------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.postfix
def test_smtp_mail_becomes_a_case_and_the_reply_leaves_through_postfix(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            message_id, data = make_mail(ANN, "ticket@help.example", subject="My invoice")
            refused = await d.postfix.send(ANN, ["ticket@help.example"], data)
            assert refused == {}

            entries = await d.wait_thread(
                "ticket=ticket-1@help.example", lambda e: len(mail_in(e)) == 1, "the mail"
            )
            (entry,) = mail_in(entries)
            assert entry["subject"] == "My invoice"
            assert entry["dmarc"] == "pass"
            case = (await d.case("ticket=ticket-1@help.example")).json()["case"]
            assert case["participant"] == ANN

            # The acknowledgement: masd -> Postfix (smtp_relay) -> relayhost (the sink).
            (ack,) = await d.sink.wait_for(1, WAIT)
            assert ack.rcpt_tos == (ANN,)
            assert bounce_case(ack.mail_from) == "ticket=ticket-1@help.example"
            assert ack.message["In-Reply-To"] == message_id
            received = ack.message.get_all("Received") or []
            assert any(f"by {MYHOSTNAME} (Postfix)" in str(r) for r in received), received
            log = await d.postfix.wait_log(f"to=<{ANN}>, relay=127.0.0.1[127.0.0.1]:{d.sink.port}")
            assert f"relay=127.0.0.1[127.0.0.1]:{d.setup.lmtp_port}" in log
            await d.wait_queue_empty()
            assert bounces(d.sink.messages) == []

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_callback_mail_reaches_the_mode_endpoint(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            _, data = make_mail(
                ANN, "ticket!callback@help.example", subject="Call me", body="Phone: +1 555 0100\n"
            )
            assert await d.postfix.send(ANN, ["ticket!callback@help.example"], data) == {}
            (request,) = await d.endpoint.wait_for(1, WAIT)
            body = request.json
            assert body["type"] == "handoff.request"
            assert body["mode"] == "callback"
            assert body["case"]["address"] == "ticket=ticket-1@help.example"
            assert body["participant"] == {"address": ANN}
            assert body["details"]["phone"] == "+1 555 0100"
            assert request.headers["authorization"] == f"Bearer {d.setup.endpoint_token}"
            await d.wait_queue_empty()

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_masd_stopped_mail_waits_in_the_queue_and_arrives_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            assert await d.masd.terminate() == 0

            # Policy listener down too: smtpd_policy_service_default_action = DUNNO
            # lets Postfix accept and queue the mail rather than refuse it.
            _, data = make_mail(ANN, "ticket@help.example", subject="While you were out")
            assert await d.postfix.send(ANN, ["ticket@help.example"], data) == {}
            (queued,) = await d.postfix.wait_queue(
                lambda q: (
                    len(q) == 1
                    and q[0]["queue_name"] == "deferred"
                    and "delay_reason" in q[0]["recipients"][0]
                ),
                "the mail deferred",
            )
            (rcpt,) = queued["recipients"]
            assert rcpt["address"] == "ticket@help.example"
            assert f"127.0.0.1[127.0.0.1]:{d.setup.lmtp_port}" in rcpt["delay_reason"]

            await d.masd.start()
            d.postfix.flush()  # postqueue -f
            await d.wait_queue_empty()
            entries = await d.wait_thread(
                "ticket=ticket-1@help.example", lambda e: len(mail_in(e)) == 1, "the mail"
            )
            assert mail_in(entries)[0]["subject"] == "While you were out"
            await d.sink.wait_for(1, WAIT)  # acknowledged, once the mail arrived

            # Exactly once: a second flush delivers nothing, no second case exists.
            d.postfix.flush()
            assert d.postfix.queue() == []
            assert len(mail_in(await d.thread("ticket=ticket-1@help.example"))) == 1
            assert (await d.case("ticket=ticket-2@help.example")).status_code == 404
            sent = [
                line
                for line in d.postfix.log().splitlines()
                if "to=<ticket@help.example>" in line and "status=sent" in line
            ]
            assert len(sent) == 1, sent

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_multi_recipient_message_with_one_bad_recipient(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            _, first = make_mail(ANN, "ticket@help.example")
            assert await d.postfix.send(ANN, ["ticket@help.example"], first) == {}
            await d.sink.wait_for(1, WAIT)

            good = ["ticket=ticket-1@help.example", "ticket@help.example"]
            bad = "ticket=ticket-99@help.example"
            _, data = make_mail(ANN, ", ".join([*good, bad]), subject="To three")
            refused = await d.postfix.send(ANN, [good[0], bad, good[1]], data)
            assert set(refused) == {bad}
            code, text = refused[bad]
            assert code == 550
            assert text.startswith(b"5.1.1 ")
            assert b"no case ticket=ticket-99@help.example" in text

            await d.wait_thread(
                "ticket=ticket-1@help.example",
                lambda e: [m["subject"] for m in mail_in(e)] == ["Help, please", "To three"],
                "the second mail in case 1",
            )
            await d.wait_thread(
                "ticket=ticket-2@help.example",
                lambda e: [m["subject"] for m in mail_in(e)] == ["To three"],
                "the mail opening case 2",
            )
            await d.wait_queue_empty()
            log = d.postfix.log()
            assert "nrcpt=2 (queue active)" in log  # the bad recipient never entered the queue
            assert not [line for line in log.splitlines() if f"to=<{bad}>, relay=" in line]
            assert bounces(d.sink.messages) == []

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_unknown_address_refused_at_rcpt_and_no_bounce(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            # The policy listener answers for each recipient during the dialogue.
            code, text = await d.postfix.rcpt(MALLORY, "ticket=ticket-7@help.example")
            assert (code, text[:6]) == (550, b"5.1.1 "), text
            assert b"no case ticket=ticket-7@help.example" in text
            code, text = await d.postfix.rcpt(MALLORY, "nosuch@help.example")
            assert (code, text[:6]) == (550, b"5.1.1 "), text
            assert b"no type 'nosuch'" in text
            code, text = await d.postfix.rcpt(MALLORY, "ticket@help.example")
            assert code == 250, text

            # A whole message to an unknown case: refused, so never queued, never bounced.
            _, data = make_mail(MALLORY, "ticket=ticket-7@help.example", authenticated=False)
            with pytest.raises(smtplib.SMTPRecipientsRefused) as caught:
                await d.postfix.send(MALLORY, ["ticket=ticket-7@help.example"], data)
            assert caught.value.recipients["ticket=ticket-7@help.example"][0] == 550
            log = await d.postfix.wait_log("NOQUEUE: reject: RCPT")
            assert "550 5.1.1 <ticket=ticket-7@help.example>" in log
            assert d.postfix.queue() == []  # no queue file: nothing that could bounce
            assert (await d.case("ticket=ticket-7@help.example")).status_code == 404

            # A mail that does get through afterwards is answered; nothing else was sent.
            _, data = make_mail(ANN, "ticket@help.example")
            assert await d.postfix.send(ANN, ["ticket@help.example"], data) == {}
            (ack,) = await d.sink.wait_for(1, WAIT)
            assert ack.rcpt_tos == (ANN,)
            await d.wait_queue_empty()
            assert len(d.sink.messages) == 1

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_forged_authentication_results_are_not_trusted(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            # Our id as is, and folded, in capitals and with a version number.
            forged = (
                f"Authentication-Results: {MYHOSTNAME}; dmarc=pass header.from=example.com\r\n"
                f"Authentication-Results:\r\n {MYHOSTNAME.upper()} 1;\r\n"
                " dmarc=pass header.from=example.com\r\n"
            ).encode()
            # 1. Our authserv-id, forged: Postfix's header_checks remove it.
            _, data = make_mail(
                MALLORY,
                "ticket!callback@help.example",
                subject="forged ours",
                body="Phone: +1 555 0199\n",
                authenticated=False,
                raw_headers=forged,
            )
            assert await d.postfix.send(MALLORY, ["ticket!callback@help.example"], data) == {}
            # 2. Another authserv-id: Postfix passes it on; masd does not trust it.
            _, data = make_mail(
                MALLORY,
                "ticket!callback@help.example",
                subject="foreign id",
                body="Phone: +1 555 0199\n",
                authenticated=False,
                headers=[("Authentication-Results", "mx.other.example; dmarc=pass")],
            )
            assert await d.postfix.send(MALLORY, ["ticket!callback@help.example"], data) == {}
            for n in (1, 2):
                entries = await d.wait_thread(
                    f"ticket=ticket-{n}@help.example",
                    lambda e: any(x["kind"] == "mail.refused" for x in e),
                    "the refusal",
                )
                (entry,) = mail_in(entries)
                assert entry["dmarc"] != "pass"
                statuses = [
                    (e["status"], e.get("reason")) for e in entries if e["kind"] == "status"
                ]
                assert statuses == [("requested", None), ("refused", "blocked")]

            # 3. The same mail, authenticated by our MX: the handoff goes out.
            _, data = make_mail(
                ANN, "ticket!callback@help.example", subject="real", body="Phone: +1 555 0100\n"
            )
            assert await d.postfix.send(ANN, ["ticket!callback@help.example"], data) == {}
            (request,) = await d.endpoint.wait_for(1, WAIT)
            assert request.json["case"]["address"] == "ticket=ticket-3@help.example"
            assert [r.json["case"]["address"] for r in d.endpoint.requests] == [
                "ticket=ticket-3@help.example"
            ]
            await d.wait_queue_empty()

    run(main)


def test_readme_postfix_section_is_packaging_postfix() -> None:
    """The README's Postfix section quotes packaging/postfix/ verbatim, file by file."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Postfix\n")
    end = readme.find("\n## ", start + 1)
    section = readme[start : end if end != -1 else len(readme)]
    shipped = sorted(p.name for p in (ROOT / "packaging" / "postfix").iterdir() if p.is_file())
    assert shipped == ["README.md", "header_checks", "main.cf.snippet", "master.cf.snippet"]
    for name in ("main.cf.snippet", "master.cf.snippet", "header_checks"):
        text = (ROOT / "packaging" / "postfix" / name).read_text()
        assert f"packaging/postfix/{name}" in section
        assert f"\n```\n{text}```\n" in section, f"README does not quote {name} verbatim"


@pytest.mark.slow
@pytest.mark.postfix
def test_milter_refuses_at_rcpt_and_at_end_of_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path, milter=True) as d:
            # Postfix asks masd's milter (no policy service here) about each RCPT.
            code, text = await d.postfix.rcpt(MALLORY, "ticket=ticket-7@help.example")
            assert (code, text) == (550, b"5.1.1 id: no case ticket=ticket-7@help.example")
            code, text = await d.postfix.rcpt(MALLORY, "nosuch@help.example")
            assert (code, text) == (550, b"5.1.1 type: no type 'nosuch' at help.example")
            code, text = await d.postfix.rcpt(MALLORY, "ticket@help.example")
            assert code == 250, text
            log = await d.postfix.wait_log("milter-reject: RCPT from")
            assert "550 5.1.1 id: no case ticket=ticket-7@help.example" in log
            assert "check_policy_service" not in d.postfix.postconf("smtpd_recipient_restrictions")

            # Over masd's max_message_bytes: refused at end of data, never queued.
            _, data = make_mail(ANN, "ticket@help.example", body="x" * MILTER_MAX_BYTES + "\n")
            with pytest.raises(smtplib.SMTPDataError) as caught:
                await d.postfix.send(ANN, ["ticket@help.example"], data)
            assert caught.value.smtp_code == 552
            assert caught.value.smtp_error.startswith(b"5.3.4 message of "), caught.value
            assert d.postfix.queue() == []

            # A mail within the limit, to a good address, goes through to masd.
            _, data = make_mail(ANN, "ticket@help.example", subject="Small")
            assert await d.postfix.send(ANN, ["ticket@help.example"], data) == {}
            entries = await d.wait_thread(
                "ticket=ticket-1@help.example", lambda e: len(mail_in(e)) == 1, "the mail"
            )
            assert mail_in(entries)[0]["subject"] == "Small"
            await d.wait_queue_empty()

    run(main)
