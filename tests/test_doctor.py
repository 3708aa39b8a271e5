"""``masd doctor``, the ``masd_messages_total`` counter and the untrusted-mail warning.

masd runs as a process (:mod:`support.masd_process`) with a real store; mail
goes in over LMTP as an MX hands it over, with its Authentication-Results
written under our authserv-id or another one; ``masd doctor`` runs as the
command an operator types.  Peers are real servers on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.masd_process import (
    ROOT,
    MasdProcess,
    MasterSetup,
    free_port,
    mx_mail,
    write_master_config,
)

from masd.config import TcpListen, UnixListen, load_config
from masd.core import signing
from masd.metrics import Metrics
from masd.ops.doctor import (
    PROBE_TYPE,
    Finding,
    PeerTarget,
    TrustSummary,
    check_accepts,
    check_dkim,
    check_greets,
    check_peer,
    diagnose,
    peer_targets,
    report,
    trust_finding,
)
from masd.service.trust_watch import WINDOW, TrustWatch
from masd.testing.lmtpclient import LmtpConnection
from masd.testing.peers import FakePeer, Recorded, SmtpSink

OTHER_ID = "mx.other.example"


def doctor(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masd", "doctor", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


async def send(setup: MasterSetup, mails: list[bytes]) -> None:
    """Every mail in one LMTP session, each to a new case; all must be recorded."""
    async with await LmtpConnection.open(("127.0.0.1", setup.lmtp_port), timeout=20) as conn:
        for raw in mails:
            result = await conn.send("ann@example.org", ["ticket@help.example"], raw)
            assert result.codes == (250,), result


async def metrics(setup: MasterSetup) -> str:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.get(f"{setup.http_url}/metrics")).text


# --------------------------------------------------------------------------- masd doctor


@pytest.mark.slow
def test_doctor_names_the_cause_when_no_mail_is_authenticated(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path, endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                # An MTA that writes its results under another authserv-id...
                mails = [
                    mx_mail("ann@example.org", "ticket@help.example", authserv_id=OTHER_ID)[1]
                    for _ in range(3)
                ]
                # ...and one with none at all.
                mails.append(mx_mail("ann@example.org", "ticket@help.example", dmarc=None)[1])
                await send(setup, mails)
                text = await metrics(setup)
                assert 'masd_messages_total{trust="absent"} 4' in text, text

                done = await asyncio.to_thread(doctor, setup.config)
                assert done.returncode == 1, done.stdout + done.stderr
                lines = done.stdout.splitlines()
                (line,) = [x for x in lines if x.startswith("FAIL authentication:")]
                assert (
                    "0 of 4 messages had a dmarc result from mx.help.example; "
                    "4 had no A-R from mx.help.example "
                    "(they carried A-R from mx.other.example (3)): "
                ) in line, line
                assert "server.trusted_authserv_ids" in line
                assert lines[-1] == "1 problem"
                # Everything else is fine: listeners, store, relay, the endpoint.
                for what in ("listener lmtp", "listener http", "store", "smtp relay"):
                    assert any(x.startswith(f"ok   {what}:") for x in lines), lines
                assert any(
                    x.startswith("ok   peer help.example type ticket mode callback:") for x in lines
                ), lines
                assert await masd.terminate() == 0

    asyncio.run(main())


@pytest.mark.slow
def test_doctor_passes_a_healthy_instance_and_fails_a_stopped_one(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path, endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                await send(setup, [mx_mail("ann@example.org", "ticket@help.example")[1]])
                done = await asyncio.to_thread(doctor, setup.config)
                assert done.returncode == 0, done.stdout + done.stderr
                assert (
                    "ok   authentication: 1 of 1 messages had a dmarc result from mx.help.example"
                    in (done.stdout)
                )
                assert done.stdout.splitlines()[-1] == "no problems"
                # masd as a peer answers the probe as docs/protocol.md §9.9 says.
                for token, ok, says in (
                    (setup.endpoint_token, True, "answered the probe 400 unknown-type"),
                    ("not-a-peers-secret", False, "answered the probe 401 unauthenticated"),
                ):
                    target = PeerTarget("masd", setup.messages_url, token)
                    finding = await asyncio.to_thread(check_peer, target)
                    assert (finding.ok, says in finding.why) == (ok, True), finding
                assert await masd.terminate() == 0

            # masd stopped: its listeners do not answer, and doctor says so.
            done = await asyncio.to_thread(doctor, setup.config, "--messages", "10")
            assert done.returncode == 1
            assert f"FAIL listener lmtp: 127.0.0.1:{setup.lmtp_port}: Connection refused" in (
                done.stdout
            ), done.stdout
            assert "FAIL listener http:" in done.stdout
            assert "ok   store:" in done.stdout  # the store is still there

    asyncio.run(main())


def test_doctor_without_a_store_and_with_peers_down(tmp_path: Path) -> None:
    setup = write_master_config(
        tmp_path, endpoint_url=f"http://127.0.0.1:{free_port()}/mas", smtp_port=free_port()
    )
    findings = diagnose(load_config(setup.config))
    text, ok = report(findings)
    assert not ok
    assert f"FAIL store: {tmp_path / 'masd.db'} does not exist" in text, text
    assert "FAIL smtp relay: 127.0.0.1:" in text
    assert "FAIL peer help.example type ticket mode callback: http://127.0.0.1:" in text
    assert text.splitlines()[-1] == f"{sum(not f.ok for f in findings)} problems"


def test_doctor_checks_dkim_keys(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=9)
    key = tmp_path / "help.example.key"
    done = subprocess.run(["openssl", "genrsa", "2048"], capture_output=True, check=True)
    key.write_bytes(done.stdout)
    key.chmod(0o600)
    text = setup.config.read_text().replace(
        '[domains."help.example".types.ticket]',
        '[domains."help.example"]\ndkim = { selector = "mas", key_file = "help.example.key" }\n\n'
        '[domains."help.example".types.ticket]',
    )
    setup.config.write_text(text)
    config = load_config(setup.config)
    (finding,) = check_dkim(config)
    assert finding == Finding(
        True, "dkim help.example selector mas", f"{key} is readable and signs"
    )
    key.write_bytes(b"-----BEGIN RSA PRIVATE KEY-----\nnot a key\n-----END RSA PRIVATE KEY-----\n")
    (finding,) = check_dkim(config)
    assert not finding.ok
    assert finding.why.startswith(f"{key} does not sign: ")
    key.unlink()
    (finding,) = check_dkim(config)
    assert finding == Finding(
        False, "dkim help.example selector mas", f"{key}: No such file or directory"
    )


# --------------------------------------------------------------------------- the parts


def test_trust_finding_texts() -> None:
    ids = ("mx.help.example",)
    assert trust_finding(TrustSummary(0, ()), ids) == Finding(
        True, "authentication", "no messages recorded yet"
    )
    ok = trust_finding(
        TrustSummary(120, (("trusted", 2), ("no-trusted-ar", 118)), (("mx.other.example", 118),)),
        ids,
    )
    assert ok.ok
    assert ok.why == (
        "2 of 120 messages had a dmarc result from mx.help.example; "
        "2 from an authenticated sender, not automated; "
        "118 had no A-R from mx.help.example (they carried A-R from mx.other.example (118))"
    )
    below = trust_finding(
        TrustSummary(5, (("below-untrusted-host", 5),), hosts=(("relay.example", 5),)), ids
    )
    assert not below.ok
    assert (
        "5 had an A-R from mx.help.example only below a Received by a host not in "
        "server.trusted_hosts: relay.example (5)"
    ) in below.why
    assert below.why.endswith("is every MTA of yours in server.trusted_hosts?")
    skipped = trust_finding(TrustSummary(1, (("no-dmarc-result", 1),)), ids)
    assert not skipped.ok
    assert "1 had an A-R from mx.help.example without a dmarc= result: " in skipped.why
    assert "IgnoreHosts (by default 127.0.0.1" in skipped.why
    assert "IgnoreAuthenticatedClients" in skipped.why
    none = trust_finding(TrustSummary(2, (("no-trusted-ar", 2),)), ids)
    assert none.why.endswith("does a DMARC verifier run in front of masd?")
    failed = trust_finding(TrustSummary(3, (("dmarc-fail", 3),)), ids)
    assert failed == Finding(
        True,
        "authentication",
        "3 of 3 messages had a dmarc result from mx.help.example; 3 had dmarc=fail",
    )


def _crafted(top: list[tuple[str, str]]) -> bytes:
    """A mail whose trace is ``top`` instead of our MX's (the rest as mx_mail makes it)."""
    raw = mx_mail("ann@example.org", "ticket@help.example", dmarc=None)[1]
    assert raw.startswith(b"Received: from mail.example.org by mx.help.example"), raw[:80]
    _, _, rest = raw.partition(b"\r\nFrom: ")  # mx_mail's Received header goes
    trace = "".join(f"{n}: {v}\r\n" for n, v in top).encode()
    return trace + b"From: " + rest


@pytest.mark.slow
def test_doctor_counts_each_cause_on_its_own(tmp_path: Path) -> None:
    by_us = ("Received", "from mail.example.org by mx.help.example; Mon, 1 Dec 2025 10:00:00 +0000")
    outside = ("Received", "from a by relay.outside.example; Mon, 1 Dec 2025 09:00:00 +0000")
    ours_pass = ("Authentication-Results", "mx.help.example; dmarc=pass header.from=example.org")

    async def main() -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path, endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                mails = [
                    mx_mail("ann@example.org", "ticket@help.example")[1],
                    mx_mail(
                        "ann@example.org",
                        "ticket@help.example",
                        headers={"Auto-Submitted": "auto-replied"},
                    )[1],
                    mx_mail("ann@example.org", "ticket@help.example", authserv_id=OTHER_ID)[1],
                    # Our verifier wrote a result, but no dmarc one (OpenDMARC skipped it).
                    _crafted([("Authentication-Results", "mx.help.example; dkim=none"), by_us]),
                    # Our id, but below a hop that is not ours: written before it reached us.
                    _crafted([by_us, outside, ours_pass]),
                    mx_mail("ann@example.org", "ticket@help.example", dmarc="fail")[1],
                ]
                await send(setup, mails)
                assert "trust=no-dmarc-result" in masd.log()
                done = await asyncio.to_thread(doctor, setup.config)
                assert await masd.terminate() == 0
        (line,) = [x for x in done.stdout.splitlines() if " authentication:" in x]
        parts = line.split("; ")
        assert parts[0] == (
            "ok   authentication: 3 of 6 messages had a dmarc result from mx.help.example"
        ), line
        assert parts[1:3] == [
            "1 from an authenticated sender, not automated",
            "1 authenticated but automated: Auto-Submitted (1)",
        ], line
        assert parts[3] == (
            "1 had no A-R from mx.help.example (they carried A-R from mx.other.example (1))"
        ), line
        assert parts[4].startswith(
            "1 had an A-R from mx.help.example without a dmarc= result: the DMARC verifier "
            "passed this mail over: OpenDMARC skips mail from its IgnoreHosts"
        ), line
        assert any(
            p == "1 had an A-R from mx.help.example only below a Received by a host not in "
            "server.trusted_hosts: relay.outside.example (1)"
            for p in parts
        ), line
        assert parts[-1] == "1 had dmarc=fail", line

    asyncio.run(main())


def test_trust_watch_counts_and_warns_once_per_window(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    watch = TrustWatch(metrics, ["mx.help.example"])
    with caplog.at_level(logging.WARNING, logger="masd.trust"):
        for _ in range(WINDOW - 1):
            watch.observe("absent")
        assert caplog.records == []
        watch.observe("pass")  # one trusted message starts the count again
        for _ in range(WINDOW - 1):
            watch.observe("absent")
        assert caplog.records == []
        watch.observe("absent")
        (record,) = caplog.records
    assert "the last 100 messages carried no trusted dmarc result" in record.message
    assert "mx.help.example" in record.message
    assert metrics.value("masd_messages_total", trust="absent") == 2 * WINDOW - 1
    assert metrics.value("masd_messages_total", trust="pass") == 1


@pytest.mark.slow
def test_a_hundred_untrusted_messages_are_warned_about_in_masd_log(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path, endpoint_url=peer.url + "mas", smtp_port=sink.port
            )
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                mails = [
                    mx_mail("ann@example.org", "ticket@help.example", dmarc=None)[1]
                    for _ in range(WINDOW)
                ]
                await send(setup, mails)
                warnings = [
                    line for line in masd.log().splitlines() if "WARNING masd.trust" in line
                ]
                assert len(warnings) == 1, masd.log()
                assert "the last 100 messages carried no trusted" in warnings[0]
                assert await masd.terminate() == 0

    asyncio.run(main())


def test_listener_checks_name_the_address(tmp_path: Path) -> None:
    port = free_port()
    finding = check_accepts("listener milter", TcpListen("127.0.0.1", port))
    assert finding == Finding(False, "listener milter", f"127.0.0.1:{port}: Connection refused")
    path = tmp_path / "none.sock"
    finding = check_greets("listener lmtp", UnixListen(path))
    assert finding == Finding(False, "listener lmtp", f"unix:{path}: No such file or directory")


# --------------------------------------------------------------------------- the peer probe


def _contract_peer(token: str, keys: tuple[bytes, ...] = ()) -> FakePeer:
    """A peer that checks the secret (and signature) first, then refuses an unknown type."""

    def answer(rec: Recorded) -> tuple[int, object]:
        if rec.headers.get("authorization") != f"Bearer {token}":
            return 401, {"ok": False, "error": "unauthenticated", "detail": "wrong secret"}
        if keys and signing.problem(keys, rec.headers.get, rec.body, time.time()):
            return 401, {"ok": False, "error": "unauthenticated", "detail": "bad signature"}
        if rec.json.get("type") not in CONTRACT_TYPES:
            return 400, {"ok": False, "error": "unknown-type", "detail": "type: unknown"}
        return 200, {"ok": True}

    return FakePeer(answer)


CONTRACT_TYPES = frozenset(
    {"handoff.request", "handoff.update", "handoff.cancel", "case.intake", "case.message"}
)


def test_peer_probe_tells_a_wrong_secret(tmp_path: Path) -> None:
    async def main() -> None:
        token_file = tmp_path / "secrets" / "callback.token"
        setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=9)
        async with _contract_peer(setup.endpoint_token) as peer:
            text = setup.config.read_text().replace("http://127.0.0.1:9/mas", peer.url + "mas")
            setup.config.write_text(text)
            (target,) = peer_targets(load_config(setup.config))
            finding = await asyncio.to_thread(check_peer, target)
            assert finding == Finding(
                True,
                "peer help.example type ticket mode callback",
                f"{peer.url}mas answered the probe 400 unknown-type (the secret is accepted)",
            )
            (probe,) = peer.requests
            assert (probe.method, probe.path) == ("POST", "/mas")
            assert probe.headers["content-type"] == "application/json"
            assert set(probe.json) == {"mas_modes_version", "type", "id"}  # no case to act on
            assert probe.json["type"] == PROBE_TYPE

            token_file.write_text("callback-not-the-peers-secret-0123456789\n")
            (target,) = peer_targets(load_config(setup.config))
            finding = await asyncio.to_thread(check_peer, target)
            assert not finding.ok
            assert finding.why.startswith(
                f"{peer.url}mas answered the probe 401 unauthenticated: the peer refuses "
                "masd's secret; is its token_file the peer's secret"
            ), finding

    asyncio.run(main())


def test_peer_probe_signs_for_a_peer_with_signing_secrets() -> None:
    keys = (b"k" * 32,)

    async def main() -> None:
        async with _contract_peer("s3cret-token", keys) as peer:
            signed = PeerTarget("peer x", peer.url + "mas", "s3cret-token", keys)
            assert (await asyncio.to_thread(check_peer, signed)).ok
            unsigned = PeerTarget("peer x", peer.url + "mas", "s3cret-token")
            finding = await asyncio.to_thread(check_peer, unsigned)
            assert not finding.ok
            assert "signing_secret_file" in finding.why
            assert "webhook-signature" in peer.requests[0].headers

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "ok", "says"),
    [
        ((403, {"ok": False, "error": "forbidden", "detail": "x"}), False, "403 forbidden: the"),
        ((404, "not found"), False, "404 without a refusal body: is this the peer's contract URL?"),
        ((200, {"ok": True}), True, "200: the secret is accepted, but a message of no contract"),
        ((503, "down"), False, "503: down"),
        ((302, ""), False, "302: "),
    ],
)
def test_peer_probe_answers(answer: tuple[int, object], ok: bool, says: str) -> None:
    async def main() -> Finding:
        async with FakePeer([answer]) as peer:
            return await asyncio.to_thread(check_peer, PeerTarget("peer x", peer.url, "t"))

    finding = asyncio.run(main())
    assert finding.ok is ok
    assert says in finding.why, finding


def test_peer_probe_of_a_webhook_prefix() -> None:
    async def main() -> tuple[Finding, Finding]:
        async with FakePeer([(404, "not found"), (401, "no")]) as peer:
            hook = PeerTarget("peer w", peer.url, "t", prefix=True)
            return (
                await asyncio.to_thread(check_peer, hook),
                await asyncio.to_thread(check_peer, hook),
            )

    found, refused = asyncio.run(main())
    assert found.ok
    assert "a webhook URL is a prefix" in found.why
    assert not refused.ok
    assert "refuses masd's secret" in refused.why


def _store_findings(setup_config: Path, database: str) -> list[str]:
    text = setup_config.read_text()
    assert text.count('database = "masd.db"') == 1, text
    setup_config.write_text(text.replace('database = "masd.db"', f'database = "{database}"'))
    return [f.line() for f in diagnose(load_config(setup_config)) if f.what == "store"]


def test_a_store_in_a_missing_directory_fails_naming_the_directory(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=9)
    store = tmp_path / "no-such-dir" / "masd.db"
    assert _store_findings(setup.config, str(store)) == [
        f"FAIL store: {store}: its directory {store.parent} does not exist, so masd cannot "
        "create the store there (create it, owned by the user masd runs as)"
    ]


def test_a_postgresql_server_that_refuses_fails_naming_host_and_port(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=9)
    port = free_port()
    found = _store_findings(setup.config, f"postgresql://masd@127.0.0.1:{port}/masd")
    assert len(found) == 1, found
    where = f"postgresql://masd@127.0.0.1:{port}/masd"
    assert found[0].startswith(f"FAIL store: cannot write {where}"), found
    assert "Connection refused" in found[0], found
