"""The pieces every part of the demo's story is made of: a scene (narration and one
mail delivered over LMTP, as one act), a reply to a mail masd sent, the report."""

from __future__ import annotations

import email.utils
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from masd.demo import record
from masd.demo.rig import DemoRig
from masd.testing.inbound import mx_mail
from masd.testing.peers import ReceivedMail

__all__ = [
    "Mail",
    "Reply",
    "Scene",
    "case_address",
    "play",
    "report_pages",
    "report_problems",
    "respond",
    "say",
    "scene",
]


@dataclass(frozen=True)
class Mail:
    """Who writes a mail of the story, to where, about what."""

    sender: str
    name: str
    to: str
    subject: str
    body: str
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Scene:
    """A numbered scene: what it shows, the mail that starts it, and how many mails
    its sender has received once it has played out (``what`` names them)."""

    heading: str
    text: tuple[str, ...]
    mail: Mail
    mails: int = 0
    what: str = ""


@dataclass(frozen=True)
class Reply:
    """A participant's reply to the ``answers``-th mail masd sent them, to its case
    address (with ``!mode`` if given); ``{address}`` in the narration is that address.
    ``mails``: how many mails they have received once it has played out."""

    heading: str
    text: tuple[str, ...]
    sender: str
    name: str
    body: str
    answers: int
    mode: str | None
    mails: int
    what: str


async def play(rig: DemoRig, act: Scene) -> bool:
    """Deliver the scene's mail, then wait for the mails its sender gets back."""
    delivered = await scene(rig, act.heading, act.text, act.mail)
    if not act.mails:
        return delivered
    return await rig.wait_mails(act.mail.sender, act.mails, act.what)


async def say(rig: DemoRig, lines: Sequence[str]) -> None:
    """Lines of narration, between acts."""
    async with rig.stage.act():
        for line in lines:
            rig.stage.line(line)


async def scene(
    rig: DemoRig, heading: str, text: Sequence[str], mail: Mail, *, in_reply_to: str | None = None
) -> bool:
    """Print the heading (if any) and the narration, then deliver ``mail``: one act."""
    async with rig.stage.act():
        if heading:
            rig.stage.heading(heading)
        for line in text:
            rig.stage.line(line)
        _, raw = mx_mail(
            mail.sender,
            mail.to,
            name=mail.name,
            subject=mail.subject,
            body=mail.body,
            headers=mail.headers,
            in_reply_to=in_reply_to,
        )
        return await rig.deliver(mail.to, mail.sender, raw)


def case_address(mail: ReceivedMail, mode: str | None = None) -> str:
    """The case address a mail from masd came from, with ``!mode`` if given."""
    address = email.utils.parseaddr(str(mail.message["From"]))[1]
    return address.replace("@", f"!{mode}@", 1) if mode else address


async def respond(rig: DemoRig, act: Reply) -> bool:
    """Deliver the reply (its subject with ``Re:``, In-Reply-To the mail it
    answers), then wait for the mails its sender gets back."""
    to = rig.sink.to(act.sender)[act.answers]
    address = case_address(to, act.mode)
    subject = str(to.message["Subject"])
    if not subject.lower().startswith("re:"):
        subject = f"Re: {subject}"
    mail = Mail(act.sender, act.name, address, subject, act.body)
    text = [line.format(address=address) for line in act.text]
    await scene(rig, act.heading, text, mail, in_reply_to=str(to.message["Message-ID"]))
    return await rig.wait_mails(act.sender, act.mails, act.what)


async def report_pages(rig: DemoRig, heading: str, note: str, role: str) -> int:
    """Print each case of ``role`` as masd recorded it; how many there are."""
    pages = await rig.read(lambda db: record.case_pages(db, role))
    async with rig.stage.act():
        rig.stage.heading(heading)
        if note:
            rig.stage.line(note)
        for page in pages:
            rig.stage.line()
            for text in page.rstrip("\n").splitlines():
                rig.stage.line("  " + text)
        rig.stage.line()
    return len(pages)


async def report_problems(rig: DemoRig, what: str, problems: Sequence[str]) -> bool:
    """Print what did not settle (and what masd still holds open); True if all did."""
    if not problems:
        return True
    left = await rig.read(record.unsettled)
    async with rig.stage.act():
        rig.stage.line(f"{what} did NOT settle:")
        for problem in problems:
            rig.stage.line(f"  - {problem}")
        for text in left:
            rig.stage.line(f"  - still {text}")
    return False
