"""The demo's first part: masd as the master of its cases, with a mode endpoint."""

from __future__ import annotations

from masd.demo import record, story
from masd.demo.rig import DemoRig
from masd.testing.config import AUTHSERV_ID, DOMAIN

__all__ = ["run_master"]

_TITLE = "masd demo: email as the master of a case (MAS mode contract v0.1)"
_CAROL = "carol@example.com"

NEW_CASE = story.Scene(
    "1. A new message opens a case",
    (
        "Ann writes to ticket@help.example, the intake address of type 'ticket'.",
        "masd opens case ticket-1 and acknowledges from the case address.",
    ),
    story.Mail(
        "ann@example.org",
        "Ann Example",
        "ticket@help.example",
        "My invoice is wrong",
        "Hello,\n\nthe invoice for March is wrong.\n",
    ),
    1,
    "acknowledgement of ticket-1",
)
CALLBACK = story.Scene(
    "2. A handoff to callback, with the phone number in the mail",
    (
        "Bob writes to ticket!callback@help.example: open a case and call me back.",
        "masd sends handoff.request to the callback endpoint; the endpoint posts",
        "statuses back; on the terminal one (completed) masd mails Bob what happened.",
    ),
    story.Mail(
        "bob@example.net",
        "Bob Example",
        "ticket!callback@help.example",
        "Please call me about my order",
        "Hi, please call me back.\n\nphone: +1 555 0100\ntime: this afternoon\n",
    ),
    2,
    "callback for bob@example.net",
)
NEGOTIATION = story.Scene(
    "3. A handoff to callback that needs negotiation",
    (
        "Carol asks for a callback but gives no phone number. The endpoint answers",
        "'negotiating' with needs [phone]; masd mails Carol the question, and her",
        "reply to the case address goes to the endpoint as handoff.update.",
    ),
    story.Mail(
        _CAROL,
        "Carol Example",
        "ticket!callback@help.example",
        "Call me, please",
        "Could someone call me about my contract?\n",
    ),
    2,
    f"question to {_CAROL}",
)
CAROL_ANSWERS = story.Reply(
    "",
    ("Carol replies to {address} with her number:",),
    _CAROL,
    "Carol Example",
    "phone: +1 555 0199\n\nThanks!\n",
    answers=1,
    mode=None,
    mails=3,
    what=f"callback for {_CAROL}",
)
NO_ENDPOINT = story.Scene(
    "4. A mode that has no endpoint is refused on the spot",
    (
        "Dave asks for chat: enabled for 'ticket' but no endpoint is configured, so",
        "masd records 'refused' (mode-unavailable) itself and continues by email:",
        "the acknowledgement and the notice are one mail.",
    ),
    story.Mail(
        "dave@example.org",
        "Dave Example",
        "ticket!chat@help.example",
        "Chat?",
        "Can we chat about this?\n",
    ),
    1,
    "refusal notice to dave@example.org",
)
AUTOMATED = story.Scene(
    "5. Automated mail is never answered (Principle 10)",
    (
        "An auto-responder (Auto-Submitted: auto-replied) writes to the intake.",
        "masd records the case but refuses to send the acknowledgement: the refused",
        "send is recorded in the thread as mail.refused (automated-sender).",
    ),
    story.Mail(
        "noreply@shop.example",
        "Shop",
        "ticket@help.example",
        "Automatic reply: out of office",
        "I am out of the office.\n",
        {"Auto-Submitted": "auto-replied"},
    ),
)


async def run_master(rig: DemoRig) -> int:
    """Five cases on type ``ticket``; 0 when every flow settled, else 1."""
    rig.begin()
    await story.say(rig, _introduction(rig))
    await story.play(rig, NEW_CASE)
    await story.play(rig, CALLBACK)
    if await story.play(rig, NEGOTIATION):
        await story.respond(rig, CAROL_ANSWERS)
    await story.play(rig, NO_ENDPOINT)
    await story.play(rig, AUTOMATED)
    refused = await rig.wait_for(
        lambda db: record.refused_sends(db, "automated-sender") > 0,
        "the refused send to the auto-responder",
    )
    if refused:
        async with rig.stage.act():
            rig.stage.event("masd", "recorded mail.refused (automated-sender); no mail went out")
    await rig.wait_for(record.settled, "every handoff closed and every outbox row sent")
    count = await story.report_pages(
        rig,
        "6. Each case's thread, as masd recorded it",
        "(also on the read side: GET /mas/v0.1/cases/{key}/thread, `masd case show`)",
        "master",
    )
    if not await story.report_problems(rig, "The demo", rig.problems):
        return 1
    mails = len(rig.sink.messages)
    await story.say(rig, [f"Done: {count} cases, {mails} mails sent, every flow settled."])
    return 0


def _introduction(rig: DemoRig) -> list[str]:
    return [
        _TITLE,
        "=" * len(_TITLE),
        "Everything runs on this machine, on 127.0.0.1 only:",
        *rig.describe(),
        f"Domain {DOMAIN}, type 'ticket' in the master role; modes enabled:",
        "  callback (endpoint above, fields phone and time, deadline 1h) and chat",
        "  (enabled, but no endpoint is configured).",
        f"Mail counts as authenticated when our MX ({AUTHSERV_ID}) wrote dmarc=pass",
        "for its From domain in Authentication-Results.",
    ]
