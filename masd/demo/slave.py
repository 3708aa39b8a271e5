"""The demo's second part: masd as a slave, under a demo CRM that owns the cases."""

from __future__ import annotations

import asyncio

from masd.demo import record, story
from masd.demo.rig import DemoRig
from masd.store import Tx
from masd.testing.config import DOMAIN

__all__ = ["run_slave"]

_TITLE = "masd as slave: an outside master owns the cases"
_ERIN = "erin@example.org"
_FRANK = "frank@example.net"


INTAKE = story.Scene(
    "7. Intake: masd reports, the master names the case",
    (
        "Erin writes to case@help.example. masd invents no id: it reports case.intake,",
        "the CRM answers with case.assign CRM-1001 and a mail.send to Erin.",
    ),
    story.Mail(
        _ERIN,
        "Erin Example",
        "case@help.example",
        "Where is my parcel?",
        "Hello,\n\nmy parcel has not arrived.\n",
    ),
    1,
    "the CRM's answer to erin",
)
ERIN_ASKS_FOR_CHAT = story.Reply(
    "8. A case message, and a mode under the block policy",
    (
        "Erin replies to {address}, asking for chat.",
        "masd reports the mail as case.message; the policy blocks transfers, so the",
        "request is reported as handoff.requested with forwarded false, and nothing",
        "else happens. The CRM answers the message with mail.send.",
    ),
    _ERIN,
    "Erin Example",
    "Could we chat about it instead?\n",
    answers=0,
    mode="chat",
    mails=2,
    what="the CRM's second answer to erin",
)
TRANSFER = story.Scene(
    "9. The master turns on a transfer; the participant asks for a call",
    (
        "Frank asks to be called. The CRM assigns CRM-1002 and sets case.policy",
        "transfers = {webhook: the callback service}; Frank then writes to the",
        "case's !callback address with his number. masd sends handoff.request to the",
        "webhook and relays every status it posts to the CRM, in order; the CRM",
        "tells Frank how it went.",
    ),
    story.Mail(
        _FRANK,
        "Frank Example",
        "case@help.example",
        "Please call me about my contract",
        "Hello,\n\nI would rather talk on the phone.\n",
    ),
    1,
    "the CRM's answer to frank",
)


FRANK_ASKS_FOR_A_CALL = story.Reply(
    "",
    ("Frank writes to {address}:",),
    _FRANK,
    "Frank Example",
    "Please call me.\n\nphone: +1 555 0142\n",
    answers=0,
    mode="callback",
    mails=2,
    what="the CRM's report to frank",
)


async def run_slave(rig: DemoRig) -> int:
    """Two cases on type ``case``; 0 when every slave flow settled, else 1."""
    rig.begin()
    await story.say(rig, _introduction(rig))
    if await story.play(rig, INTAKE):
        await story.respond(rig, ERIN_ASKS_FOR_CHAT)
    if await story.play(rig, TRANSFER):
        await story.respond(rig, FRANK_ASKS_FOR_A_CALL)
    await rig.wait_for(_settled, "every slave handoff closed and every row sent")
    while rig.crm.busy and rig.time_left() > 0:
        await asyncio.sleep(0.05)
    return await _report(rig)


def _settled(db: Tx) -> bool:
    return record.settled(db, "slave") and bool(record.handoffs(db, "slave"))


def _introduction(rig: DemoRig) -> list[str]:
    return [
        "",
        "",
        _TITLE,
        "=" * len(_TITLE),
        f"Type 'case' of {DOMAIN} is in the slave role. Its master is a demo CRM at",
        f"  {rig.crm.url}: it names the cases, decides what is mailed and when",
        "  a case may go to another mode. masd records, reports and carries out.",
        f"Transfers may go to the callback service at {rig.transfer.url}",
        "  (the type's 'webhooks' entry); the type's default policy is",
        '  {autonomous_send = false, transfers = "block"}.',
    ]


async def _report(rig: DemoRig) -> int:
    async with rig.stage.act():
        rig.stage.heading("10. What the master received, in order")
        for message in rig.crm.received:
            address = (message.get("case") or {}).get("address", "(no case yet)")
            detail = ""
            if message.get("type") == "handoff.status":
                detail = f"  seq {message.get('seq')} {message.get('status')}"
            elif message.get("type") == "handoff.requested":
                forwarded = str(message.get("forwarded")).lower()
                detail = f"  {message.get('mode')} forwarded={forwarded}"
            rig.stage.line(f"  {message.get('type'):<18} {address}{detail}")
    heading = "11. Each slave case's thread, as masd recorded it"
    count = await story.report_pages(rig, heading, "", "slave")
    if not await story.report_problems(rig, "The slave part", rig.problems + rig.crm.problems):
        return 1
    received = len(rig.crm.received)
    done = (
        f"Done: {count} slave cases, {received} messages to the master, every slave flow settled."
    )
    await story.say(rig, [done])
    return 0
