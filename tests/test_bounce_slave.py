"""Bounces on a slave case (docs/protocol.md §22, §13): the master hears of a bounce as
``case.message`` (automated, reason ``bounce``), and its ``mail.send`` to a suppressed address
still goes; a delay is recorded and told too, and suppresses nothing.  Over the real HTTP edge
and delivery path, on a real SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from support.bounces import deliver_raw, postfix_dsn, sent_mails
from support.http import CRM, Running, deliver, serving

MESSAGES = "/mas/v0.1/messages"
ALICE = "alice@example.com"


async def _post(r: Running, message: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {CRM}"}
    answer = await r.client.post(MESSAGES, content=json.dumps(message).encode(), headers=headers)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def _rows(r: Running, sql: str) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = await r.store.read(lambda db: db.execute(sql).fetchall())
    return rows


async def _assigned_case(r: Running) -> tuple[dict[str, str], str]:
    got = await deliver(r.store, r.rt, "case@help.example", r.clock.now())
    ((intake_ref,),) = await _rows(r, "SELECT intake_ref FROM intakes")
    assign = {
        "mas_modes_version": "0.1",
        "type": "case.assign",
        "id": "assign-1",
        "intake_ref": intake_ref,
        "resource_id": "c-1",
    }
    case: dict[str, str] = (await _post(r, assign))["case"]
    return case, got.message_ref


def _send(case: dict[str, str], mid: str, reply_to: str) -> dict[str, Any]:
    return {
        "mas_modes_version": "0.1",
        "type": "mail.send",
        "id": mid,
        "case": case,
        "in_reply_to": reply_to,
        "subject": "Your printer",
        "body": "We will send a technician on Monday.\n",
    }


async def _case_messages(r: Running) -> list[dict[str, Any]]:
    rows = await _rows(r, "SELECT payload FROM outbox WHERE kind = 'contract' ORDER BY id")
    messages = [json.loads(p) for (p,) in rows]
    return [m for m in messages if m["type"] == "case.message"]


async def _thread(r: Running, key: str) -> list[tuple[str, dict[str, Any]]]:
    rows = await _rows(r, f"SELECT kind, data FROM thread WHERE case_key = '{key}' ORDER BY seq")
    return [(kind, json.loads(data)) for kind, data in rows]


def test_the_master_hears_of_a_bounce_and_still_decides(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as r:
            case, first = await _assigned_case(r)
            await _post(r, _send(case, "send-1", first))
            (mail,) = await sent_mails(r.store)
            assert mail.rcpt_to == ALICE
            assert mail.mail_from.startswith("case=c-1+bounce-")

            # A delay first: recorded, told to the master, nothing suppressed.
            delay = postfix_dsn(mail.mail_from, ALICE, action="delayed", status="4.4.1")
            await deliver_raw(r.store, r.rt, mail.mail_from, delay, r.clock.now())
            dsn = postfix_dsn(mail.mail_from, ALICE)
            await deliver_raw(r.store, r.rt, mail.mail_from, dsn, r.clock.now())

            thread = await _thread(r, case["key"])
            bounced = [data for kind, data in thread if kind == "mail.bounced"]
            assert [(b["status"], b["permanent"]) for b in bounced] == [
                ("4.4.1", False),
                ("5.1.1", True),
            ]
            told = (await _case_messages(r))[-2:]
            assert [m["event"]["automated"] for m in told] == [
                {"is": True, "reason": "bounce"},
                {"is": True, "reason": "bounce"},
            ]
            assert [m["message_ref"] for m in told] == [b["message_ref"] for b in bounced]
            assert told[-1]["event"]["mail_from"] == ""
            assert await _rows(r, "SELECT address FROM suppressions") == [(ALICE,)]

            # The master's mail.send to the suppressed address is still sent.
            await _post(r, _send(case, "send-2", first))
            assert [m.rcpt_to for m in await sent_mails(r.store)] == [ALICE, ALICE]
            kinds = [kind for kind, _ in await _thread(r, case["key"])]
            assert kinds[-1] == "mail.out"
            assert "mail.refused" not in kinds

    asyncio.run(main())
