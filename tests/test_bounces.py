"""Bounces over real sockets (docs/protocol.md §22): masd as a process, mail in over LMTP,
its mail out to an SMTP sink, the thread and the feed read over HTTP.

An acknowledgement leaves with its bounce address; a forged, missing or other case's tag
is refused at RCPT; a DSN to the real one marks the mail bounced, shows in the thread and
the feed, and suppresses the address, so the next acknowledgement to it is refused until
``masd suppress drop`` lifts it.  Mail to a bounce address that is no bounce is ordinary
automated mail on the case.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.bounces import postfix_dsn
from support.masd_process import WAIT
from support.watch import Watched, watched

from masd.core.bounce import split_bounce
from masd.testing import lmtpclient
from masd.testing.inbound import mx_mail
from masd.testing.peers import ReceivedMail

ANN = "ann@example.org"
BOB = "bob@example.net"


async def _thread(w: Watched, address: str) -> list[dict[str, Any]]:
    page = await w.get(f"/mas/v0.1/cases/{quote(address, safe='')}/thread", limit=1000)
    entries: list[dict[str, Any]] = page["entries"]
    return entries


async def _deliver(w: Watched, rcpt: str, data: bytes, sender: str = "") -> lmtpclient.LmtpResult:
    return await lmtpclient.deliver(
        ("127.0.0.1", w.setup.lmtp_port), sender, [rcpt], data, timeout=WAIT
    )


def _event_of(w: Watched, message_ref: str) -> dict[str, Any]:
    config = tomllib.loads(w.setup.config.read_text())
    conn = sqlite3.connect(w.setup.config.parent / config["server"]["database"])
    try:
        row = conn.execute("SELECT event FROM messages WHERE message_ref = ?", (message_ref,))
        found = row.fetchone()
    finally:
        conn.close()
    assert found is not None, message_ref
    event: dict[str, Any] = json.loads(found[0])
    return event


async def _ack(w: Watched, sender: str, count: int) -> ReceivedMail:
    await w.send("ticket@help.example", sender)
    mails = await w.sink.wait_for(count, WAIT)
    return mails[count - 1]


async def _refused_at_rcpt(w: Watched, rcpt: str) -> None:
    result = await _deliver(w, rcpt, postfix_dsn(rcpt, ANN))
    assert result.codes == (550,), result
    assert result.recipients[0].rcpt.enhanced == "5.1.1", result


async def _bounce_story(w: Watched) -> None:
    ack = await _ack(w, ANN, 1)
    case1 = "ticket=ticket-1@help.example"
    split = split_bounce(ack.mail_from, "+")
    assert split is not None, ack.mail_from
    assert split.address == case1
    assert ack.message["From"] == case1  # the From header stays the case address
    assert ack.rcpt_tos == (ANN,)

    # Forged, missing and other case's tags are refused at RCPT, and nothing is recorded.
    other = await _ack(w, BOB, 2)
    other_split = split_bounce(other.mail_from, "+")
    assert other_split is not None
    for rcpt in (
        f"ticket=ticket-1+bounce-{other_split.tag}@help.example",
        "ticket=ticket-1+bounce-@help.example",
        "ticket=ticket-1+bounce-2-aaaaaaaaaaaaaaaa@help.example",
        f"ticket+bounce-{split.tag}@help.example",
        f"ticket=ticket-9+bounce-{split.tag}@help.example",
    ):
        await _refused_at_rcpt(w, rcpt)
    assert [e["kind"] for e in await _thread(w, case1)] == ["mail.in", "mail.out"]

    # The DSN comes back (MTAs may lowercase it) and is recorded, never answered.
    result = await _deliver(w, ack.mail_from.lower(), postfix_dsn(ack.mail_from, ANN))
    assert result.codes == (250,), result
    entries = await _thread(w, case1)
    assert [e["kind"] for e in entries] == ["mail.in", "mail.out", "mail.bounced"]
    out, bounced = entries[1], entries[2]
    assert out["delivery"]["state"] == "bounced"
    assert out["delivery"]["status"] == "5.1.1"
    assert out["delivery"]["remote_mta"] == "mx.example.net"
    assert "User unknown" in out["delivery"]["diagnostic"]
    assert bounced["mail_seq"] == out["seq"]
    assert bounced["recipient"] == ANN
    assert bounced["permanent"] is True
    assert bounced["status"] == "5.1.1"
    assert bounced["message_ref"].startswith("msg-")
    assert len(w.sink.messages) == 2  # no answer to the bounce

    feed = [e["entry"] for e in await w.all_events() if e["entry"]["kind"] == "mail.bounced"]
    assert feed == [bounced]

    # The next own mail to Ann is refused; Bob's still goes.
    await w.send("ticket@help.example", ANN)
    (refused,) = [
        e for e in await _thread(w, "ticket=ticket-3@help.example") if e["kind"] != "mail.in"
    ]
    assert refused["kind"] == "mail.refused"
    assert (refused["reason"], refused["to"]) == ("suppressed", ANN)
    listed = await w.cli("suppress", "list", "--json")
    assert listed.code == 0, listed.err
    (row,) = [json.loads(line) for line in listed.out.splitlines()]
    assert (row["address"], row["status"], row["case"]) == (ANN, "5.1.1", case1)
    dropped = await w.cli("suppress", "drop", "Ann@Example.org")
    assert dropped.code == 0, dropped.err
    assert (await w.cli("suppress", "drop", ANN)).code == 1
    third = await _ack(w, ANN, 3)
    assert third.rcpt_tos == (ANN,)


@pytest.mark.slow
def test_a_bounce_marks_its_mail_shows_in_the_feed_and_suppresses(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as w:
            await _bounce_story(w)

    asyncio.run(main())


@pytest.mark.slow
def test_other_mail_to_a_bounce_address_is_automated_mail_on_the_case(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as w:
            ack = await _ack(w, ANN, 1)
            _, data = mx_mail(ANN, ack.mail_from, subject="Out of office")
            result = await _deliver(w, ack.mail_from, data, sender=ANN)
            assert result.codes == (250,), result
            entries = await _thread(w, "ticket=ticket-1@help.example")
            assert [e["kind"] for e in entries] == ["mail.in", "mail.out", "mail.in"]
            assert entries[2]["automated"] is True
            event = _event_of(w, entries[2]["message_ref"])
            assert event["automated"] == {"is": True, "reason": "bounce-address"}
            assert entries[1]["delivery"]["state"] != "bounced"
            await asyncio.sleep(0.2)
            assert len(w.sink.messages) == 1  # automated: never answered

    asyncio.run(main())
