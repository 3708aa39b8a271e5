"""``masd case``, ``masd tail`` and ``masd explain`` as subprocesses, beside a running masd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.masd_process import ROOT, WAIT, mx_mail, write_master_config
from support.watch import ANN, BOB, Watched, watched

from masd.config import load_config
from masd.core.address import parse_address
from masd.core.engine import CaseView
from masd.edges.lmtp import check_address
from masd.edges.lmtp_replies import Replies
from masd.ops.explain import default_recipient, explain
from masd.store import open_store
from masd.store.cases import create as create_case

NOW = 1_790_000_000.0

#: A second master type whose ids look like the first's: an id alone is then ambiguous.
ORDERS = """
[domains."help.example".types.order]
role = "master"
id_prefix = "ticket-"
"""


@pytest.mark.slow
def test_case_list_and_show_by_address_key_or_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path, more_config=ORDERS) as run:
            await run.send("ticket@help.example", ANN, subject="First")
            await run.send("ticket!callback@help.example", BOB, subject="Second")
            await run.send("order@help.example", BOB, subject="An order")
            await run.endpoint.wait_for(1, WAIT)
            await run.sink.wait_for(3, WAIT)

            listed = await run.cli("case", "list")
            assert listed.code == 0, listed.err
            header, *rows = listed.out.splitlines()
            assert header.split() == [
                "KEY", "ROLE", "PARTICIPANT", "OPENED", "LAST", "ACTIVITY", "OPEN", "HANDOFF"
            ]  # fmt: skip
            assert [r.split()[0] for r in rows] == [
                "order=ticket-1@help.example",
                "ticket=ticket-2@help.example",
                "ticket=ticket-1@help.example",
            ]
            assert rows[1].split()[-1] == "callback:requested"
            assert rows[0].split()[-1] == "-"
            # The same filters as GET /mas/v0.1/cases.
            opened = await run.cli("case", "list", "--state", "open")
            assert [r.split()[0] for r in opened.out.splitlines()[1:]] == [
                "ticket=ticket-2@help.example"
            ]
            bobs = await run.cli("case", "list", "--participant", BOB, "--limit", "1")
            lines = bobs.out.splitlines()
            assert lines[1].split()[0] == "order=ticket-1@help.example"
            assert lines[-1].startswith("(more: --after c")
            cursor = lines[-1].split()[-1].rstrip(")")
            rest = await run.cli("case", "list", "--participant", BOB, "--after", cursor)
            assert [r.split()[0] for r in rest.out.splitlines()[1:]] == [
                "ticket=ticket-2@help.example"
            ]
            as_json = json.loads((await run.cli("case", "list", "--json")).out)
            assert as_json == await run.get("/mas/v0.1/cases")

            # A case by its id alone, when one case has it.
            shown = await run.cli("case", "show", "TICKET-2")
            assert shown.code == 0, shown.err
            assert shown.out.startswith("case ticket=ticket-2@help.example  (master role")
            (out,) = [x for x in shown.out.splitlines() if "  contract.out " in x]
            assert "handoff.request" in out
            assert "[sent, 1 attempt, " in out
            ambiguous = await run.cli("case", "show", "ticket-1")
            assert ambiguous.code == 1
            assert ambiguous.err.splitlines()[-1] == (
                "masd: ticket-1 is ambiguous: 2 cases have that id (order=ticket-1@help.example, "
                "ticket=ticket-1@help.example); give the address"
            )
            by_address = await run.cli("case", "show", "Order=Ticket-1@Help.Example")
            assert by_address.code == 0, by_address.err
            unknown = await run.cli("case", "show", "ticket-9")
            assert (unknown.code, unknown.err.splitlines()[-1]) == (1, "masd: no case ticket-9")
            doc = json.loads((await run.cli("case", "show", "ticket-2", "--json")).out)
            assert doc["case"]["key"] == "ticket=ticket-2@help.example"
            assert [e["kind"] for e in doc["thread"]["entries"]][:2] == ["mail.in", "status"]

    asyncio.run(main())


async def _lines(stream: asyncio.StreamReader, n: int) -> list[str]:
    out = []
    for _ in range(n):
        line = await asyncio.wait_for(stream.readline(), WAIT)
        assert line, "masd tail ended"
        out.append(line.decode().rstrip("\n"))
    return out


@pytest.mark.slow
def test_tail_prints_the_latest_events_then_follows(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as run:
            await run.send("ticket@help.example", ANN, subject="First")
            await run.sink.wait_for(1, WAIT)
            latest = await run.cli("tail", "-n", "1")
            assert latest.code == 0, latest.err
            (line,) = latest.out.splitlines()
            assert line.split()[1:3] == ["ticket=ticket-1@help.example", "mail.out"]
            assert "[sent, 1 attempt, " in line
            events = await run.all_events()
            as_json = await run.cli("tail", "--json", "-n", "5")
            shown = [json.loads(x) for x in as_json.out.splitlines()]
            assert [e["cursor"] for e in shown] == [e["cursor"] for e in events]

            follower = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "masd", "tail", "--follow", "-n", "1", "--json",
                "--config", str(run.setup.config),
                cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                assert follower.stdout is not None
                # The latest event printed first: the follower has read the end of the feed.
                (last,) = [json.loads(x) for x in await _lines(follower.stdout, 1)]
                assert last["cursor"] == events[-1]["cursor"]
                await run.send("ticket@help.example", BOB, subject="Second")
                got = [json.loads(x) for x in await _lines(follower.stdout, 2)]
                assert [e["entry"]["kind"] for e in got] == ["mail.in", "mail.out"]
                assert got[0]["entry"]["subject"] == "Second"
                assert got[0]["case"]["key"] == "ticket=ticket-2@help.example"
            finally:
                follower.send_signal(signal.SIGINT)
                code = await asyncio.wait_for(follower.wait(), WAIT)
            assert code == 0

            one = await run.cli("tail", "--case", "ticket-2", "-n", "100")
            assert {x.split()[1] for x in one.out.splitlines()} == {"ticket=ticket-2@help.example"}

    asyncio.run(main())


# --------------------------------------------------------------------------- masd explain


def _explain(run_dir: Path, config: Path, raw: bytes, *args: str) -> tuple[int, str, str]:
    import subprocess

    eml = run_dir / "mail.eml"
    eml.write_bytes(raw)
    done = subprocess.run(
        [sys.executable, "-m", "masd", "explain", str(eml), "--config", str(config), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


def _json_of(
    run_dir: Path, config: Path, raw: bytes, *args: str, cases: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``masd explain --json`` in this process: the same function on the same input; a
    case or bounce address is looked up in a store of its own holding ``cases`` (keys of
    cases whose participant is Ann)."""
    loaded = load_config(config)
    rcpt = args[args.index("--rcpt") + 1] if "--rcpt" in args else default_recipient(raw, loaded)
    assert rcpt is not None
    with open_store(str(run_dir / "seeded.db")) as store:
        for key in cases:
            addr = parse_address(key, delimiter="+", domains=loaded.domains)
            role = "slave" if addr.type == "case" else "master"
            view = CaseView(
                addr.key, addr.canonical, addr.domain, addr.type, addr.id or "", role, ANN
            )
            store.write_sync(lambda tx, view=view: create_case(tx, view, NOW))  # type: ignore[misc]
        found = explain(loaded, raw, rcpt, now=NOW, read=store.read_sync)
    doc: dict[str, Any] = json.loads(json.dumps(found.json()))
    (run_dir / "seeded.db").unlink()
    return doc


def test_explain_is_a_dry_run_of_one_delivery(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    config = setup.config
    store = tmp_path / "masd.db"

    _, intake = mx_mail(ANN, "ticket@help.example", subject="Printer jams")
    code, out, err = _explain(tmp_path, config, intake)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "recipient    ticket@help.example"
    assert "  LMTP       250 2.0.0 would be recorded" in lines
    assert "  chosen     mx.help.example" in lines
    assert "dmarc        pass (dmarc=pass from mx.help.example)" in lines
    assert "cause        trusted: dmarc=pass from mx.help.example, not automated" in lines
    assert "automated    no" in lines
    assert f"participant  {ANN}" in lines
    assert "  - open case ticket=ticket-N@help.example (participant ann@example.org)" in lines
    assert f"  - mail the acknowledge to {ANN}: would be sent" in lines
    # Neither the store nor the network: no database was created.
    assert not store.exists()

    doc = _json_of(tmp_path, config, intake)
    assert doc["recipient"]["kind"] == "intake"
    assert doc["trust"]["authenticated"] is True
    assert doc["caps"] == {"per_case": 20, "per_recipient_per_day": 10}

    _, handoff = mx_mail(BOB, "ticket!callback@help.example", body="Phone: +1 555 0100\n")
    doc = _json_of(tmp_path, config, handoff)
    code, out, err = _explain(tmp_path, config, handoff, "--json")
    assert code == 0, err
    from_cli = json.loads(out)
    assert from_cli["would"][2].pop("deadline_at") > doc["would"][2].pop("deadline_at")
    assert from_cli == doc
    done = [w["do"] for w in doc["would"]]
    assert done == [
        "open-case", "thread", "open-handoff", "status", "send-contract", "send-mail"
    ]  # fmt: skip
    request = doc["would"][4]
    assert (request["type"], request["url"]) == ("handoff.request", "http://127.0.0.1:9/mas")

    _, auto = mx_mail(ANN, "ticket@help.example", headers={"Auto-Submitted": "auto-replied"})
    doc = _json_of(tmp_path, config, auto)
    assert doc["automated"] == {"is": True, "reason": "Auto-Submitted: auto-replied"}
    (ack,) = [w for w in doc["would"] if w["do"] == "send-mail"]
    assert (ack["sent"], ack["refused"]) == (False, "automated-sender")

    _, unsigned = mx_mail(ANN, "ticket@help.example", dmarc=None)
    doc = _json_of(tmp_path, config, unsigned)
    assert doc["trust"]["dmarc"] == "absent"
    (ack,) = [w for w in doc["would"] if w["do"] == "send-mail"]
    assert ack["refused"] == "unauthenticated-sender"

    # A forged A-R below a Received from a host masd does not trust is not believed.
    forged = (
        b"Authentication-Results: mx.help.example; dmarc=fail header.from=example.org\r\n"
        b"Received: from relay.example.net by mx.help.example; Tue, 1 Dec 2026 10:00:00 +0000\r\n"
        b"Received: from evil.example by relay.example.net; Tue, 1 Dec 2026 09:59:00 +0000\r\n"
        b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.org\r\n"
        b"From: ann@example.org\r\nTo: ticket@help.example\r\nSubject: hi\r\n\r\nhi\r\n"
    )
    # Our verifier's A-R without a dmarc result (OpenDMARC skipped a mail from 127.0.0.1).
    skipped = (
        b"Authentication-Results: mx.help.example; dkim=none\r\n"
        b"Received: from localhost by mx.help.example; Tue, 1 Dec 2026 10:00:00 +0000\r\n"
        b"From: ann@example.org\r\nTo: ticket@help.example\r\nSubject: hi\r\n\r\nhi\r\n"
    )
    code, out, err = _explain(tmp_path, config, skipped)
    assert code == 0, err
    lines = out.splitlines()
    assert "  A-R        mx.help.example; dkim=none" in lines
    assert "dmarc        absent (no trusted dmarc result)" in lines
    (cause,) = [x for x in lines if x.startswith("cause ")]
    assert cause.startswith(
        "cause        no-dmarc-result: Authentication-Results from mx.help.example without "
        "a dmarc= result: the DMARC verifier passed this mail over: OpenDMARC skips mail "
        "from its IgnoreHosts (by default 127.0.0.1"
    ), cause
    assert _json_of(tmp_path, config, skipped)["trust"]["cause"] == "no-dmarc-result"

    doc = _json_of(tmp_path, config, forged)
    assert doc["trust"]["cause"] == "dmarc-fail"
    assert doc["trust"]["trusted_headers"] == 2
    assert doc["trust"]["block_ends_at"].startswith("Received: from evil.example")
    assert len(doc["trust"]["authentication_results"]) == 1
    assert doc["trust"]["dmarc"] == "fail"

    key = "ticket=ticket-7@help.example"
    case = _json_of(tmp_path, config, intake, "--rcpt", key, cases=(key,))
    assert not any("exists" in a for a in case["assumed"])  # the store said so
    assert case["participant"] == ANN
    assert case["would"][0] == {
        "do": "thread",
        "kind": "mail.in",
        "from": ANN,
        "subject": "Printer jams",
        "dmarc": "pass",
        "automated": False,
    }

    for rcpt, line in (
        ("ticket@elsewhere.example", "550 5.1.2"),
        ("invoice@help.example", "550 5.1.1 type: no type 'invoice' at help.example"),
        ("ticket=a/b@help.example", "550 5.1.1"),
    ):
        refused = _json_of(tmp_path, config, intake, "--rcpt", rcpt)
        assert refused["lmtp"].startswith(line), refused
        assert refused["would"] == []

    # The slave role: an intake goes to the master as case.intake; nothing else happens.
    crm = tmp_path / "secrets" / "crm.token"
    crm.write_text("crm-secret-0123456789\n")
    crm.chmod(0o600)
    config.write_text(
        config.read_text()
        + '\n[domains."help.example".types.case]\nrole = "slave"\n'
        + 'master = { url = "http://127.0.0.1:9/crm", token_file = "secrets/crm.token" }\n'
    )
    doc = _json_of(tmp_path, config, intake, "--rcpt", "case@help.example")
    assert doc["recipient"]["role"] == "slave"
    assert doc["would"] == [
        {
            "do": "send-contract",
            "type": "case.intake",
            "to": "master:help.example/case",
            "url": "http://127.0.0.1:9/crm",
            "requested_mode": None,
        }
    ]
    absent = _json_of(tmp_path, config, intake, "--rcpt", "ticket=ticket-8@help.example")
    assert absent["lmtp"] == "550 5.1.1 id: no case ticket=ticket-8@help.example"
    assert absent["would"] == []
    crm7 = "case=CRM-7@help.example"
    doc = _json_of(tmp_path, config, intake, "--rcpt", crm7, cases=(crm7,))
    assert [w["do"] for w in doc["would"]] == ["thread", "send-contract"], doc
    assert doc["would"][1]["type"] == "case.message"
    assert "the case has its type's default policy" in doc["assumed"]

    nowhere = b"From: ann@example.org\r\nTo: someone@example.net\r\n\r\nhi\r\n"
    code, out, err = _explain(tmp_path, config, nowhere)
    assert code == 2
    assert "no recipient at a configured domain (help.example); give --rcpt" in err
    assert not store.exists()
    # A case address is looked up in the store: without one, explain says so and creates none.
    code, out, err = _explain(tmp_path, config, intake, "--rcpt", "ticket=ticket-3@help.example")
    assert code == 1
    assert f"is looked up in the store, and there is no store at {store}" in err
    assert not store.exists()


def test_explain_refuses_as_the_lmtp_listener_does(tmp_path: Path) -> None:
    """The recipient, type and size checks are the edge's own functions."""
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    config = load_config(setup.config)
    _, raw = mx_mail(ANN, "ticket@help.example", subject="Hi")
    for rcpt in ("ticket@nowhere.example", "nope@help.example", "bad address@help.example"):
        reply, text, _ = check_address(config, rcpt)
        assert reply is not Replies.RECIPIENT_OK
        assert explain(config, raw, rcpt, now=NOW).lmtp == reply.line(text)
    limit = config.server.max_message_bytes
    big = raw + b"x" * limit
    assert explain(config, big, "ticket@help.example", now=NOW).lmtp == (
        f"552 5.3.4 message over {limit} octets (server.max_message_bytes)"
    )


def test_tail_needs_a_migrated_store(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    run = Watched(setup, None, None, None, None)  # type: ignore[arg-type]

    async def main() -> None:
        done = await run.cli("tail")
        assert done.code == 1
        assert "pending migrations" in done.err

    asyncio.run(main())
