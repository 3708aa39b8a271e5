"""Mail in: one recipient's copy of an LMTP delivery, in either role (docs/protocol.md §3)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass

from masd.core.address import Address
from masd.core.bounce import BounceRecipient, split_bounce
from masd.core.engine import CaseView, CreateCase, master_mail
from masd.core.event import ParsedMail
from masd.core.slave import slave_intake, slave_mail
from masd.service import bounce_mail
from masd.service.apply import Recorded, apply
from masd.service.runtime import ALL_WAKES, NO_WAKES, Job, Runtime, UnknownCase, Wakes
from masd.service.state import load_case, policy_of
from masd.store import Tx, cases, messages

log = logging.getLogger("masd")

#: docs/protocol.md §3: the same message delivered again within 7 days is recorded once.
DEDUPE_WINDOW = 7 * 24 * 3600


@dataclass(frozen=True)
class Delivered:
    message_ref: str
    case_key: str
    duplicate: bool = False
    #: What the job queued and which deadline it wrote (see :class:`Wakes`);
    #: a Delivered that does not say wakes both.
    wakes: Wakes = ALL_WAKES


def dedupe_key(message_id: str | None, rcpt_to: str, sha256: str) -> str:
    """docs/protocol.md §3: same Message-ID (or none), same recipient, same SHA-256 of the bytes."""
    text = f"{message_id or ''}\0{rcpt_to.lower()}\0{sha256}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class _Mail:
    """The copy being delivered: to whom, what, and its dedupe key."""

    rcpt: Address
    parsed: ParsedMail
    raw: bytes
    sha256: str
    dedupe: str

    def record(self, job: Job, case_key: str | None, intake_ref: str | None = None) -> None:
        ev = self.parsed.event
        messages.record(
            job.tx,
            ev,
            self.raw,
            self.sha256,
            job.now,
            dedupe=self.dedupe,
            case_key=case_key,
            intake_ref=intake_ref,
            seen_before=job.now - DEDUPE_WINDOW,
        )


def already_recorded(tx: Tx, mail: ParsedMail, sha256: str, now: float) -> bool:
    """Is this recipient's copy of ``mail`` recorded already (a repeat :func:`deliver`
    answers as a duplicate)?  A read: the LMTP edge asks before it reads a bounce."""
    dedupe = dedupe_key(mail.event.message_id, mail.event.rcpt_to, sha256)
    return messages.seen(tx, dedupe, since=now - DEDUPE_WINDOW) is not None


def deliver(
    rt: Runtime,
    tx: Tx,
    rcpt: Address,
    mail: ParsedMail,
    raw: bytes,
    sha256: str,
    now: float,
    bounce: bounce_mail.Read | None = None,
) -> Delivered:
    """Record one recipient's copy of a mail and everything it causes.

    ``bounce``: for a bounce address, the mail already read as a bounce (else read here)."""
    ev = mail.event
    dedupe = dedupe_key(ev.message_id, ev.rcpt_to, sha256)
    seen = (
        messages.seen(tx, dedupe, since=now - DEDUPE_WINDOW) if messages.looks_first(tx) else None
    )
    if seen is not None:
        return Delivered(seen.message_ref, seen.case_key, duplicate=True, wakes=NO_WAKES)
    job, copy = Job(rt, tx, now), _Mail(rcpt, mail, raw, sha256, dedupe)
    split = split_bounce(ev.rcpt_to, rt.config.server.recipient_delimiter)
    if split is not None:
        return _to_bounce_address(job, copy, split, bounce)
    if rt.type_view(rcpt.domain, rcpt.type).role == "slave":
        if rcpt.kind == "intake":
            return _slave_intake(job, copy)
        return _slave_case_mail(job, copy)
    return _master(job, copy)


def _to_bounce_address(
    job: Job, copy: _Mail, split: BounceRecipient, done: bounce_mail.Read | None
) -> Delivered:
    """docs/protocol.md §22: a bounce is recorded and marks its mail; other mail to a
    bounce address is ordinary mail on the case, automated."""
    case = _case(job, copy.rcpt)
    outbox_id, report = bounce_mail.check(job, case, split, copy.raw, done)
    if report is None:
        parsed = bounce_mail.automated_as(copy.parsed, bounce_mail.NOT_A_BOUNCE)
        copy = dataclasses.replace(copy, parsed=parsed)
        if case.role == "slave":
            return _slave_case_mail(job, copy)
        return _master(job, copy)
    copy.record(job, case.key)
    effects = bounce_mail.receive(job, case, outbox_id, copy.parsed, report)
    applied = apply(job, case, effects)
    return Delivered(copy.parsed.event.message_ref, case.key, wakes=applied.wakes)


def _case(job: Job, rcpt: Address) -> CaseView:
    case = load_case(job.rt, job.tx, rcpt.key)
    if case is None:
        raise UnknownCase(f"no case {rcpt.key}")
    return case


def _master(job: Job, copy: _Mail) -> Delivered:
    """docs/protocol.md §11: a mail to a master-role address (an intake opens a case)."""
    rt, rcpt, ev = job.rt, copy.rcpt, copy.parsed.event
    typ = rt.type_view(rcpt.domain, rcpt.type)
    case: CaseView | None = None
    new_case_id = ""
    if rcpt.kind == "resource":
        case = _case(job, rcpt)
    else:
        number = cases.next_number(job.tx, rcpt.domain, rcpt.type)
        new_case_id = f"{typ.id_prefix}{number}"
    effects = master_mail(case, rcpt, copy.parsed, typ, job.context(), new_case_id=new_case_id)
    opened = case is None
    if case is None:
        created = next(e for e in effects if isinstance(e, CreateCase))
        case = created.case
        cases.create(job.tx, case, job.now)
    copy.record(job, case.key)
    rest = [e for e in effects if not isinstance(e, CreateCase)]
    applied = apply(job, case, rest, recorded=Recorded(ev, case.key, opened=opened))
    return Delivered(ev.message_ref, case.key, wakes=applied.wakes)


def _slave_intake(job: Job, copy: _Mail) -> Delivered:
    """docs/protocol.md §13.1: intake mail becomes case.intake, pending until assigned."""
    rcpt, ev = copy.rcpt, copy.parsed.event
    master = job.rt.master_of(rcpt.domain, rcpt.type)
    opened = slave_intake(rcpt, copy.parsed, job.context(), master=master)
    copy.record(job, None, intake_ref=opened.intake_ref)
    applied = apply(job, None, [opened])
    log.info(
        "intake pending intake_ref=%s message_ref=%s",
        opened.intake_ref,
        ev.message_ref,
        extra={"message_ref": ev.message_ref},
    )
    return Delivered(ev.message_ref, "", wakes=applied.wakes)


def _slave_case_mail(job: Job, copy: _Mail) -> Delivered:
    """docs/protocol.md §13.2: mail on an assigned case is recorded and reported as case.message."""
    rt, rcpt, ev = job.rt, copy.rcpt, copy.parsed.event
    case = _case(job, rcpt)
    copy.record(job, case.key)
    terms = rt.slave_terms(case.domain, case.type, policy_of(rt, job.tx, case))
    effects = slave_mail(case, rcpt, copy.parsed, terms, job.context())
    applied = apply(job, case, effects, recorded=Recorded(ev, case.key, opened=False))
    return Delivered(ev.message_ref, case.key, wakes=applied.wakes)
