"""masd behind a real Postfix with a real DMARC verifier: OpenDKIM and OpenDMARC.

The last test runs the one-host test of docs/operations.md section 14 as the guide has it.

The chain an operator builds from packaging/postfix/ and packaging/dmarc/:
mail comes in by SMTP to Postfix, whose ``smtpd_milters`` are OpenDKIM
(verifying) and OpenDMARC, configured from packaging/dmarc/ verbatim
(:mod:`support.dmarc`); they write ``Authentication-Results:
mx.help.example; ...``, the authserv-id masd trusts; Postfix relays
help.example to masd over LMTP.  A dnsmasq on loopback serves the DNS
records: customer.example publishes a DKIM key, SPF (``ip4:192.0.2.25
-all``) and ``_dmarc`` with ``p=reject``; help.example publishes masd's DKIM
key.  The sending MTA's address is set with Postfix's XCLIENT (a test-only
setting), so SPF sees a sender on the Internet, not loopback.

masd's own mail leaves through the same Postfix, so OpenDKIM checks masd's
signature on its way out; the relayhost is an :class:`SmtpSink`.
"""

from __future__ import annotations

import asyncio
import email.policy
import email.utils
import os
import secrets
import smtplib
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.bounces import bounce_case
from support.dmarc import DkimKey, DmarcChain, dkim_key, dkim_sign, require_dmarc
from support.dmarc import shipped as shipped_dmarc
from support.masd_process import AUTHSERV_ID, DOMAIN, MasdProcess, write_secret
from support.postfix import PostfixInstance, require_postfix
from test_operations_doc import GUIDE, onehost_blocks, onehost_script
from test_postfix_e2e import Deployment, MasdSetup, free_ports, mail_in

from masd.core.address import parse_address
from masd.testing.peers import FakePeer, SmtpSink

WAIT = 20.0
CUSTOMER = "customer.example"
ANN = f"ann@{CUSTOMER}"
SELECTOR = "s1"
#: The customer's outgoing MTA (in its SPF record) and a host that is not.
CUSTOMER_MTA = "192.0.2.25"
SPOOFER = "203.0.113.66"
CALLBACK = f"ticket!callback@{DOMAIN}"


# --------------------------------------------------------------------------- the deployment


@dataclass
class Chain(Deployment):
    dmarc: DmarcChain
    customer_key: DkimKey
    database: Path

    async def send_from(
        self, client: str, mail_from: str, rcpts: Sequence[str], data: bytes
    ) -> dict[str, tuple[int, bytes]]:
        """One SMTP transaction as if from the MTA at ``client`` (XCLIENT)."""
        port = self.postfix.smtp_port

        def work() -> dict[str, tuple[int, bytes]]:
            with smtplib.SMTP("127.0.0.1", port, timeout=WAIT) as smtp:
                helo = f"mail.{mail_from.rsplit('@', 1)[1]}"
                smtp.ehlo(helo)
                code, text = smtp.docmd("XCLIENT", f"ADDR={client} NAME={helo} HELO={helo}")
                assert code == 220, (code, text)
                smtp.ehlo(helo)
                return smtp.sendmail(mail_from, list(rcpts), data)

        return await asyncio.to_thread(work)

    async def send_local(
        self, mail_from: str, rcpts: Sequence[str], data: bytes
    ) -> dict[str, tuple[int, bytes]]:
        """One SMTP transaction from 127.0.0.1 itself, as a test on the MX sends it."""
        port = self.postfix.smtp_port

        def work() -> dict[str, tuple[int, bytes]]:
            with smtplib.SMTP("127.0.0.1", port, timeout=WAIT) as smtp:
                return smtp.sendmail(mail_from, list(rcpts), data)

        return await asyncio.to_thread(work)

    def stored_raw(self, address: str) -> list[bytes]:
        """The bytes masd stored for each message of case ``address`` (its SQLite file)."""
        with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT raw FROM messages WHERE case_key = ? ORDER BY received_at",
                (parse_address(address, delimiter="").key,),
            ).fetchall()
        return [bytes(r[0]) for r in rows]


def write_config(
    directory: Path, *, endpoint_url: str, smtp_port: int, ports: Sequence[int], key: DkimKey
) -> tuple[Path, str, str]:
    """masd.toml trusting the verifier's authserv-id, signing with ``key``."""
    lmtp, http, policy = ports
    directory.mkdir(parents=True)
    admin_token = "admin-" + secrets.token_hex(16)
    endpoint_token = "callback-" + secrets.token_hex(16)
    write_secret(directory / "secrets" / "admin.token", admin_token)
    write_secret(directory / "secrets" / "callback.token", endpoint_token)
    write_secret(directory / "dkim" / f"{DOMAIN}.key", key.private_pem.decode().rstrip("\n"))
    (directory / "masd.toml").write_text(f"""\
[server]
lmtp = "127.0.0.1:{lmtp}"
http = "127.0.0.1:{http}"
policy = "127.0.0.1:{policy}"
database = "masd.db"
smtp_relay = "127.0.0.1:{smtp_port}"
trusted_authserv_ids = ["{AUTHSERV_ID}"]
admin_token_file = "secrets/admin.token"
hostname = "masd.{DOMAIN}"

[domains."{DOMAIN}"]
dkim = {{ selector = "mas", key_file = "dkim/{DOMAIN}.key" }}

[domains."{DOMAIN}".types.ticket]
role = "master"
modes = ["callback"]

[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "{endpoint_url}"
token_file = "secrets/callback.token"
deadline = "1h"
fields = ["phone"]
""")
    return directory / "masd.toml", admin_token, endpoint_token


def add_verifier(postfix: PostfixInstance, chain: DmarcChain) -> None:
    """packaging/dmarc/main.cf.snippet verbatim, then its site values; XCLIENT (test only)."""
    with (postfix.config_dir / "main.cf").open("a") as main:
        main.write("\n# ---- packaging/dmarc/main.cf.snippet, verbatim\n")
        main.write(shipped_dmarc("main.cf.snippet"))
    postfix.postconf(
        "-e",
        f"dkim_milter = {chain.verifier.dkim_milter}",
        f"dmarc_milter = {chain.verifier.dmarc_milter}",
        "smtpd_authorized_xclient_hosts = 127.0.0.0/8",
    )


@asynccontextmanager
async def deployment(
    tmp_path: Path, more_records: Mapping[str, list[str]] | None = None
) -> AsyncIterator[Chain]:
    programs = require_postfix()
    require_dmarc()
    customer_key, masd_key = dkim_key(), dkim_key()
    records = {
        f"{SELECTOR}._domainkey.{CUSTOMER}": [customer_key.record],
        CUSTOMER: [f"v=spf1 ip4:{CUSTOMER_MTA} -all"],
        f"_dmarc.{CUSTOMER}": ["v=DMARC1; p=reject"],
        f"mas._domainkey.{DOMAIN}": [masd_key.record],
        DOMAIN: ["v=spf1 ip4:127.0.0.1 -all"],
        f"_dmarc.{DOMAIN}": ["v=DMARC1; p=reject"],
        **(more_records or {}),
    }
    async with DmarcChain(records) as chain, FakePeer() as endpoint, SmtpSink() as sink:
        lmtp, http_port, policy = ports = free_ports(3)
        postfix = PostfixInstance(
            masd_lmtp=f"inet:127.0.0.1:{lmtp}",
            masd_policy=f"inet:127.0.0.1:{policy}",
            relay_port=sink.port,
            programs=programs,
        )
        try:
            add_verifier(postfix, chain)
            config, admin_token, endpoint_token = write_config(
                tmp_path / "masd",
                endpoint_url=endpoint.url + "mas",
                smtp_port=postfix.smtp_port,
                ports=ports,
                key=masd_key,
            )
            setup = MasdSetup(config, lmtp, http_port, policy, admin_token, endpoint_token)
            await postfix.start()
            async with (
                MasdProcess(config, tmp_path / "masd.log") as masd,
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{http_port}",
                    headers={"Authorization": f"Bearer {admin_token}"},
                    timeout=WAIT,
                ) as http,
            ):
                try:
                    yield Chain(
                        postfix,
                        masd,
                        setup,
                        endpoint,
                        sink,
                        http,
                        chain,
                        customer_key,
                        tmp_path / "masd" / "masd.db",
                    )
                except BaseException:
                    print(f"---- Postfix log ({postfix.maillog}) ----\n{postfix.log()}")
                    raise
                code = await masd.terminate()
                assert code == 0, masd.log()
        finally:
            await postfix.stop()
            postfix.remove()


def customer_mail(
    to: str, *, subject: str, body: str, sign: DkimKey | None, raw_headers: bytes = b""
) -> bytes:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = f"Ann <{ANN}>"
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = f"<{secrets.token_hex(8)}@{CUSTOMER}>"
    msg.set_content(body)
    data = msg.as_bytes()
    if sign is not None:
        data = dkim_sign(data, domain=CUSTOMER, selector=SELECTOR, key=sign)
    return raw_headers + data


def statuses(entries: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["status"], e.get("reason")) for e in entries if e["kind"] == "status"]


def auth_results(raw: bytes) -> list[str]:
    """Every Authentication-Results value of a message, unfolded, top down."""
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    return [" ".join(str(v).split()) for v in msg.get_all("Authentication-Results") or []]


def run(test: Any) -> None:
    asyncio.run(test())


# --------------------------------------------------------------------------- the four flows


@pytest.mark.slow
@pytest.mark.postfix
def test_signed_mail_passes_dmarc_and_the_handoff_goes_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            data = customer_mail(
                CALLBACK, subject="Call me", body="Phone: +1 555 0100\n", sign=d.customer_key
            )
            assert await d.send_from(CUSTOMER_MTA, ANN, [CALLBACK], data) == {}

            (request,) = await d.endpoint.wait_for(1, WAIT)
            assert request.json["type"] == "handoff.request"
            assert request.json["participant"] == {"address": ANN}
            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(case, lambda e: len(mail_in(e)) == 1, "the mail")
            assert mail_in(entries)[0]["dmarc"] == "pass"
            assert statuses(entries)[0] == ("requested", None)
            (raw,) = d.stored_raw(case)
            results = auth_results(raw)
            assert f"{AUTHSERV_ID}; dmarc=pass (p=reject dis=none) header.from={CUSTOMER}" in (
                results
            ), results
            assert any(r.startswith(f"{AUTHSERV_ID}; dkim=pass") for r in results), results

            (ack,) = await d.sink.wait_for(1, WAIT)  # acknowledged
            assert ack.rcpt_tos == (ANN,)
            await d.wait_queue_empty()

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_spoofed_unsigned_mail_fails_dmarc_is_recorded_and_blocked(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            data = customer_mail(
                CALLBACK, subject="Call me", body="Phone: +1 555 0199\n", sign=None
            )
            assert await d.send_from(SPOOFER, ANN, [CALLBACK], data) == {}

            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(
                case, lambda e: any(x["kind"] == "mail.refused" for x in e), "the refusal"
            )
            assert mail_in(entries)[0]["dmarc"] == "fail"
            assert statuses(entries) == [("requested", None), ("refused", "blocked")]
            (raw,) = d.stored_raw(case)
            results = auth_results(raw)
            assert f"{AUTHSERV_ID}; dmarc=fail (p=reject dis=none) header.from={CUSTOMER}" in (
                results
            ), results

            await d.wait_queue_empty()
            assert not [e for e in await d.thread(case) if e["kind"] == "mail.out"]
            assert d.sink.messages == []  # nothing mailed to the forged sender
            assert d.endpoint.requests == []

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_outside_authentication_results_with_our_id_are_removed(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            forged = (
                f"Authentication-Results: {AUTHSERV_ID}; dmarc=pass header.from={CUSTOMER}\r\n"
                f"Authentication-Results:\r\n {AUTHSERV_ID.upper()} 1;\r\n"
                f" dkim=pass header.d={CUSTOMER} header.s={SELECTOR}\r\n"
            ).encode()
            data = customer_mail(
                CALLBACK,
                subject="Trust me",
                body="Phone: +1 555 0199\n",
                sign=None,
                raw_headers=forged,
            )
            assert await d.send_from(SPOOFER, ANN, [CALLBACK], data) == {}

            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(
                case, lambda e: any(x["kind"] == "mail.refused" for x in e), "the refusal"
            )
            assert mail_in(entries)[0]["dmarc"] == "fail"
            assert statuses(entries) == [("requested", None), ("refused", "blocked")]
            (raw,) = d.stored_raw(case)
            ours = [r for r in auth_results(raw) if r.lower().startswith(AUTHSERV_ID)]
            # Only the verifier's own results: the forged ones never reached it or masd.
            assert not [r for r in ours if "pass" in r.split(";", 1)[1]], ours
            assert f"{AUTHSERV_ID}; dmarc=fail (p=reject dis=none) header.from={CUSTOMER}" in ours
            assert b"header.s=s1" not in raw
            await d.wait_queue_empty()
            assert d.sink.messages == []
            assert d.endpoint.requests == []

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_masd_acknowledgement_passes_opendkim_on_its_way_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            to = f"ticket@{DOMAIN}"
            data = customer_mail(to, subject="Hello", body="Hello.\n", sign=d.customer_key)
            assert await d.send_from(CUSTOMER_MTA, ANN, [to], data) == {}

            (ack,) = await d.sink.wait_for(1, WAIT)
            assert bounce_case(ack.mail_from) == "ticket=ticket-1@help.example"
            assert ack.message["DKIM-Signature"] is not None
            results = auth_results(ack.message.as_bytes())
            # The verifier's result on masd's mail, leaving through Postfix.
            passed = [
                r
                for r in results
                if r.startswith(f"{AUTHSERV_ID}; dkim=pass")
                and f"header.d={DOMAIN}" in r
                and "header.s=mas" in r
            ]
            assert passed, results
            await d.wait_queue_empty()

    run(main)


@pytest.mark.slow
@pytest.mark.postfix
def test_mail_sent_on_the_mx_itself_is_skipped_by_opendmarc_and_doctor_says_so(
    tmp_path: Path,
) -> None:
    """The first test an operator tries: a mail sent from the MX (127.0.0.1). OpenDMARC
    skips its IgnoreHosts (127.0.0.1 by default), so only OpenDKIM's result is there."""

    async def main() -> None:
        async with deployment(tmp_path) as d:
            to = f"ticket@{DOMAIN}"
            data = customer_mail(to, subject="Test", body="Testing.\n", sign=d.customer_key)
            assert await d.send_local(ANN, [to], data) == {}
            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(case, lambda e: len(mail_in(e)) == 1, "the mail")
            assert mail_in(entries)[0]["dmarc"] == "absent"
            (raw,) = d.stored_raw(case)
            ours = [r for r in auth_results(raw) if r.lower().startswith(AUTHSERV_ID)]
            assert ours, auth_results(raw)
            assert not [r for r in ours if "dmarc=" in r], ours
            assert "trust=no-dmarc-result" in d.masd.log()

            done = await asyncio.to_thread(run_doctor, d.setup.config)
            (line,) = [x for x in done.stdout.splitlines() if " authentication:" in x]
            assert line.startswith(
                "FAIL authentication: 0 of 1 messages had a dmarc result from mx.help.example; "
                "1 had an A-R from mx.help.example without a dmarc= result: "
            ), line
            assert "OpenDMARC skips mail from its IgnoreHosts (by default 127.0.0.1" in line
            assert "below a host" not in line
            await d.wait_queue_empty()
            assert d.sink.messages == []  # nothing acknowledged

    run(main)


def run_doctor(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masd", "doctor", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --------------------------------------------------------------------------- docs/operations.md §14

#: The one-host test's sender domain here (the guide's is test.help.example).
TESTER = "tester.example"


def run_onehost(index: int, values: Mapping[str, str], cwd: Path) -> str:
    """Block ``index`` of docs/operations.md section 14, as the guide has it, in bash."""
    block = onehost_blocks(GUIDE.read_text())[index]
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run(
        ["bash", "-c", onehost_script(block, values)],
        cwd=cwd,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def published(stdout: str) -> dict[str, list[str]]:
    """The records the first block prints (``NAME TXT "VALUE"``), for the DNS server."""
    records: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        name, kind, value = line.split(" ", 2)
        assert kind == "TXT", line
        assert value.startswith('"'), line
        assert value.endswith('"'), line
        records.setdefault(name, []).append(value[1:-1])
    return records


@pytest.mark.slow
@pytest.mark.postfix
def test_the_one_host_recipe_of_the_operations_guide_is_acknowledged(tmp_path: Path) -> None:
    """docs/operations.md section 14 verbatim: a key, its records, a signed mail sent from
    127.0.0.2 to the SMTP port; OpenDMARC checks it, masd acknowledges it, doctor agrees."""
    work = tmp_path / "onehost"
    work.mkdir()
    values = {"DOMAIN": TESTER, "SELECTOR": "s1"}
    records = published(run_onehost(0, values, work))
    assert set(records) == {f"s1._domainkey.{TESTER}", f"_dmarc.{TESTER}"}, records

    async def main() -> None:
        async with deployment(tmp_path / "chain", records) as d:
            values.update(
                {
                    "FROM": f"you@{TESTER}",
                    "TO": f"ticket@{DOMAIN}",
                    "MX": "127.0.0.1",
                    "PORT": str(d.postfix.smtp_port),  # the private Postfix's port 25
                    "PYTHON": sys.executable,
                    "CONFIG": str(d.setup.config),
                }
            )
            await asyncio.to_thread(run_onehost, 1, values, work)
            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(case, lambda e: len(mail_in(e)) == 1, "the mail")
            assert mail_in(entries)[0]["dmarc"] == "pass"
            (raw,) = d.stored_raw(case)
            assert f"{AUTHSERV_ID}; dmarc=pass (p=reject dis=none) header.from={TESTER}" in (
                auth_results(raw)
            ), auth_results(raw)
            (ack,) = await d.sink.wait_for(1, WAIT)  # acknowledged
            assert ack.rcpt_tos == (f"you@{TESTER}",)
            await d.wait_queue_empty()

            out = await asyncio.to_thread(run_onehost, 2, values, work)
            assert (
                "ok   authentication: 1 of 1 messages had a dmarc result from mx.help.example; "
                "1 from an authenticated sender, not automated"
            ) in out, out
            assert "\nno problems\n" in out, out  # doctor, then the case list
            assert any(line.startswith(case) for line in out.splitlines()), out

    run(main)
