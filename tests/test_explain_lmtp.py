"""``masd explain`` answers as a real LMTP delivery does, for every kind of address.

masd runs as a process (its LMTP listener, its store, an SMTP sink for its mail out). For
each recipient, explain is run first (in this process, on the running masd's store opened
read-only, as ``masd explain`` opens it), then the same mail is delivered over LMTP: the
reply's code, enhanced code and (for a refusal) text, and the kind of thread entry the
delivery records, are what explain said.
"""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest
from support.bounces import postfix_dsn
from support.masd_process import WAIT
from support.watch import ANN, BOB, Watched, watched

from masd.config import load_config
from masd.core.bounce import split_bounce
from masd.ops.explain import Explained, explain
from masd.store import open_store
from masd.testing import lmtpclient
from masd.testing.inbound import mx_mail

CASE1 = "ticket=ticket-1@help.example"


def _explain(w: Watched, rcpt: str, data: bytes, sender: str) -> Explained:
    config = load_config(w.setup.config)
    database = tomllib.loads(w.setup.config.read_text())["server"]["database"]
    with open_store(str(w.setup.config.parent / database), migrate=False) as store:
        return explain(config, data, rcpt, mail_from=sender, now=0.0, read=store.read_sync)


def _recorded(x: Explained) -> str | None:
    """The kind of the thread entry explain says the mail is recorded as."""
    kinds = [w.get("kind") for w in x.would if w["do"] in ("thread", "send-contract")]
    if any(w["do"] == "open-case" for w in x.would) or kinds[:1] == ["case.intake"]:
        return "mail.in"
    return next((k for k in kinds if k in ("mail.in", "mail.bounced")), None)


async def _new_entries(w: Watched, before: int) -> list[dict[str, Any]]:
    events = await w.all_events()
    return [e["entry"] for e in events[before:]]


async def _compare(w: Watched, name: str, rcpt: str, data: bytes, sender: str) -> dict[str, Any]:
    said = await asyncio.to_thread(_explain, w, rcpt, data, sender)
    before = len(await w.all_events())
    result = await lmtpclient.deliver(
        ("127.0.0.1", w.setup.lmtp_port), sender, [rcpt], data, timeout=WAIT
    )
    final = result.recipients[0].final
    code, enhanced, *_ = said.lmtp.split(" ", 2)
    assert (int(code), enhanced) == (final.code, final.enhanced), (name, said.lmtp, str(final))
    if final.code != 250:
        assert said.lmtp == f"{final.code} {final.lines[0]}", name
        assert said.would == [], name
        return {"lmtp": said.lmtp}
    entries = await _new_entries(w, before)
    assert entries, name
    assert _recorded(said) == entries[0]["kind"], (name, said.would, entries[0])
    return {"lmtp": said.lmtp, "automated": said.automated, "kind": entries[0]["kind"]}


@pytest.mark.slow
def test_explain_answers_as_the_lmtp_listener_for_every_kind_of_address(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as w:
            await w.send("ticket@help.example", ANN)
            ack = (await w.sink.wait_for(1, WAIT))[0]
            split = split_bounce(ack.mail_from, "+")
            assert split is not None
            assert split.address == CASE1
            tag = split.tag
            _, hello = mx_mail(BOB, "ticket@help.example", subject="Hello")
            _, reply = mx_mail(ANN, CASE1, subject="Re: your ticket")
            _, phone = mx_mail(BOB, "ticket!callback@help.example", body="Phone: +1 555 0100\n")
            _, away = mx_mail(ANN, ack.mail_from, subject="Out of office")
            dsn = postfix_dsn(ack.mail_from, ANN)
            kinds = [
                ("open", "ticket@help.example", hello, BOB),
                ("case", CASE1, reply, ANN),
                ("callback", "ticket!callback@help.example", phone, BOB),
                ("unknown case", "ticket=ticket-9@help.example", reply, ANN),
                ("bounce, no report", ack.mail_from, away, ANN),
                ("bounce, forged tag", "ticket=ticket-1+bounce-2-aaaaaaaaaaaaaaaa@help.example",
                 dsn, ""),
                ("bounce, empty tag", "ticket=ticket-1+bounce-@help.example", dsn, ""),
                ("bounce, other case", f"ticket=ticket-2+bounce-{tag}@help.example", dsn, ""),
                ("bounce on an intake", f"ticket+bounce-{tag}@help.example", dsn, ""),
                ("bounce, valid DSN", ack.mail_from.lower(), dsn, ""),
                ("unknown domain", "ticket@nowhere.example", hello, BOB),
                ("unknown type", "invoice@help.example", hello, BOB),
                ("bad address", "ticket=a/b@help.example", hello, BOB),
            ]  # fmt: skip
            seen = {name: await _compare(w, name, *rest) for name, *rest in kinds}
            assert seen["bounce, forged tag"]["lmtp"] == (
                "550 5.1.1 bounce address of ticket=ticket-1@help.example: tag does not verify"
            )
            assert seen["bounce, valid DSN"]["kind"] == "mail.bounced"
            assert seen["bounce, no report"]["automated"] == {
                "is": True,
                "reason": "bounce-address",
            }
            assert seen["open"]["kind"] == seen["case"]["kind"] == "mail.in"
            assert seen["unknown domain"]["lmtp"].startswith("550 5.1.2 ")

    asyncio.run(main())
