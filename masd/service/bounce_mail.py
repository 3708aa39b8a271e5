"""Bounces in the service: envelope senders out, bounce reports in (docs/protocol.md §22).

- :func:`envelope`: the bounce address a mail is queued with as its envelope
  sender, its tag naming the mail's outbox row.
- :func:`suppression`: masd's own mail to a suppressed address is refused.
- :func:`receive`: mail to a bounce address whose tag verified.  A bounce is
  recorded (raw bytes kept, no ``mail.in``, no acknowledgement), marks the
  mail, suppresses its recipient when it failed for good and is told to a
  slave case's master as ``case.message``; any other mail is an ordinary mail
  on the case, automated (reason ``bounce-address``).  The recipient is always
  the one the tag names: a report claiming another address failed (anyone who
  mails a case learns a bounce address) records that claim as a detail only.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Final

from masd.core.bounce import BounceRecipient, bounce_address, make_tag, own_mail_refusal
from masd.core.bounce import verify_tag as _verify
from masd.core.dsn import BounceReport, read_bounce
from masd.core.engine import CaseView, Effect, SendContract
from masd.core.errors import MasdError
from masd.core.event import ParsedMail
from masd.core.slave import case_message
from masd.core.trust import Automation
from masd.service.runtime import Job, Runtime, UnknownCase
from masd.store import Tx, append_thread, bounces, cases

log = logging.getLogger("masd")

#: automated.reason of mail to a bounce address that is no bounce
NOT_A_BOUNCE: Final = "bounce-address"
#: automated.reason of a bounce told to the master
BOUNCE: Final = "bounce"


def envelope(rt: Runtime, tx: Tx, case: CaseView, outbox_id: int, now: float) -> str:
    """The bounce address of mail ``outbox_id`` of ``case``: its envelope sender."""
    tag = make_tag(bounces.key(tx, now), case.key, outbox_id)
    return bounce_address(case.address, rt.config.server.recipient_delimiter, tag)


def suppression(purpose: str, until: float | None, now: float) -> str | None:
    """``suppressed`` when masd's own mail goes to an address that bounced for good
    (``until``: its suppression's end, :attr:`masd.store.cases.Standing.suppressed_until`)."""
    if purpose == "reply":  # a master's mail.send: the master decides
        return None
    return own_mail_refusal(purpose, until, now)


def verify(tx: Tx, case_key: str, tag: str) -> int | None:
    """The outbox row ``tag`` names on case ``case_key``, None when it does not verify."""
    return _verify(bounces.key_or_none(tx), case_key, tag)


def automated_as(mail: ParsedMail, reason: str) -> ParsedMail:
    """``mail``, marked automated for ``reason`` (in its event too)."""
    event = dataclasses.replace(mail.event, automated=True, automated_reason=reason)
    return dataclasses.replace(mail, event=event, automation=Automation(True, reason))


#: Read.unread: the edge did not read the mail, having found it recorded already.
SKIPPED: Final = "skipped"
#: Read.unread: the reading ran out of its time budget; the mail is read as no bounce.
OVER_BUDGET: Final = "over-budget"


class NotRead(MasdError):
    """A mail to a bounce address that must be read before it is recorded and was not
    (LMTP ``451 4.3.2``: the sender tries again)."""

    code = "bounce-unread"


@dataclass(frozen=True)
class Read:
    """What :func:`~masd.core.dsn.read_bounce` said of a mail, read before its store job
    (the LMTP edge reads it in a process of its own); ``report`` None: no bounce.
    ``unread``: why it was not read (:data:`SKIPPED`, :data:`OVER_BUDGET`), None: it was."""

    report: BounceReport | None
    unread: str | None = None


def read(raw: bytes) -> Read:
    return Read(read_bounce(raw))


def check(
    job: Job, case: CaseView, split: BounceRecipient, raw: bytes, done: Read | None
) -> tuple[int, BounceReport | None]:
    """The outbox row bounce address ``split`` of ``case`` names, and what the mail
    reports (None: it is no bounce); ``done``: the mail already read, else it is read here.

    :class:`UnknownCase` (``550 5.1.1``) when the tag does not verify for the case.
    """
    outbox_id = verify(job.tx, case.key, split.tag)
    if outbox_id is None:
        raise UnknownCase(f"bounce address of {case.address}: the tag does not verify")
    if done is not None and done.unread == SKIPPED:
        # The edge saw it recorded and did not read it; it is no longer (purged since):
        # read it on the next try rather than record it unread.
        raise NotRead(f"mail to a bounce address of {case.address} not read yet")
    return outbox_id, (done or read(raw)).report


def receive(
    job: Job, case: CaseView, outbox_id: int, mail: ParsedMail, report: BounceReport
) -> list[Effect]:
    """Record bounce ``report`` on ``case``; the caller has recorded the message.
    Returns the effects still to apply (a slave case's ``case.message``)."""
    ev = mail.event
    sent = bounces.mail_out(job.tx, case.key, outbox_id)
    recipient = sent[1] if sent else None
    bounces.record(
        job.tx,
        bounces.Bounce(
            ev.message_ref,
            outbox_id,
            case.key,
            recipient or "",
            report.status,
            report.diagnostic,
            report.remote_mta,
            report.permanent,
            job.now,
        ),
    )
    if report.permanent and recipient:
        until = job.now + job.rt.config.server.suppress_for
        row = bounces.Suppression(
            recipient.lower(), until, report.status, case.key, ev.message_ref, job.now
        )
        bounces.suppress(job.tx, row)
    append_thread(
        job.tx, case.key, "mail.bounced", bounced_entry(sent, ev.message_ref, report), at=job.now
    )
    log.info(
        "bounce case=%s mail=%s status=%s permanent=%s",
        case.key,
        outbox_id,
        report.status,
        report.permanent,
        extra={"case": case.key, "message_ref": ev.message_ref},
    )
    return told_master(job.rt, case, mail)


def told_master(rt: Runtime, case: CaseView, mail: ParsedMail) -> list[Effect]:
    """A bounce on a slave case is told to its master as ``case.message``; none else."""
    if case.role != "slave":
        return []
    master = rt.master_of(case.domain, case.type)
    told = automated_as(mail, BOUNCE).event
    message = case_message(case, mail.event.message_ref, told.to_json())
    return [SendContract(master.peer, master.url, message)]


def bounced_entry(
    sent: tuple[int, str] | None, message_ref: str, report: BounceReport
) -> dict[str, Any]:
    """The ``mail.bounced`` entry.  Its ``recipient`` is the one the tag names (the mail's
    own, which anyone who mails the case can learn): what the report claims failed is only
    ``claimed_recipient``, given when it names another address, and suppresses nothing."""
    recipient = sent[1] if sent else None
    entry: dict[str, Any] = {
        "mail_seq": sent[0] if sent else None,
        "message_ref": message_ref,
        "recipient": recipient,
        "status": report.status,
        "diagnostic": report.diagnostic,
        "remote_mta": report.remote_mta,
        "permanent": report.permanent,
    }
    claimed = report.recipient
    if claimed and claimed.lower() != (recipient or "").lower():
        entry["claimed_recipient"] = claimed
    return entry


def tag_verifies(tx: Tx, case_key: str, tag: str) -> bool:
    """At RCPT: does case ``case_key`` exist and ``tag`` verify for it?"""
    return cases.exists(tx, case_key) and verify(tx, case_key, tag) is not None
