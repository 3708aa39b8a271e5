"""The one place the engine's effects are carried out, inside the input's store job.

:func:`apply` writes each effect through the store and returns what it
applied (:class:`Applied`): each send's refusal, what the outbox and the
timer were given to do, the statuses recorded.  Principle 10 (docs/protocol.md §4.4)
is enforced in :func:`_send_mail`, the one place every outbound mail passes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, assert_never

from masd.core import compose
from masd.core.engine import (
    AbandonRequest,
    AssignIntake,
    CaseView,
    CreateCase,
    Effect,
    OpenHandoff,
    OpenIntake,
    SendContract,
    SendMail,
    SetPolicy,
    Status,
    Thread,
)
from masd.core.event import GatewayEvent
from masd.core.principle10 import CAP_WINDOW_SECONDS, Caps, Counts, Recipient, decide_send
from masd.core.status import MACHINE
from masd.logs import shown
from masd.service import bounce_mail
from masd.service.runtime import NO_WAKES, Job, Wakes
from masd.store import Tx, append_thread, cases, handoffs, messages, outbox

log = logging.getLogger("masd")


@dataclass(frozen=True)
class Applied:
    """What one :func:`apply` (or several, joined with ``|``) carried out."""

    #: Each SendMail's refusal (None: queued), in order.
    refusals: tuple[str | None, ...] = ()
    #: What the outbox and the timer have to do once the job commits.
    wakes: Wakes = NO_WAKES
    #: The statuses recorded, in order.
    statuses: tuple[Status, ...] = ()

    def __or__(self, other: Applied) -> Applied:
        return Applied(
            self.refusals + other.refusals,
            self.wakes | other.wakes,
            self.statuses + other.statuses,
        )


NOTHING: Final = Applied()


@dataclass(frozen=True)
class Recorded:
    """The mail the running job has just recorded on ``case_key``.

    A send that answers it reads its sender and threading headers from here
    rather than reading back (and decoding) the row the job has just written.
    """

    event: GatewayEvent
    case_key: str
    #: the job created the case for this mail, so it is the case's only mail
    opened: bool


class _Applying:
    """One :func:`apply` under way: where its effects go, and what they did."""

    def __init__(
        self, job: Job, case: CaseView | None, quiet: bool, recorded: Recorded | None
    ) -> None:
        self.job, self.tx, self.now = job, job.tx, job.now
        self.case_or_none = case
        self.quiet = quiet
        self.recorded = recorded
        self.refusals: list[str | None] = []
        self.queued = False
        self.handed: list[outbox.OutboxItem] | None = []  # None: one waits behind another
        self.deadline: float | None = None
        self.statuses: list[Status] = []
        #: the id and head of the mail a send about to pass would queue (outbox.reserve)
        self.reserved: outbox.Reserved | None = None

    @property
    def case(self) -> CaseView:
        if self.case_or_none is None:
            raise TypeError("this effect needs a case, and apply was given none")
        return self.case_or_none

    def thread(self, kind: str, data: dict[str, Any]) -> None:
        append_thread(self.tx, self.case.key, kind, data, at=self.now)

    def queue(self, row: outbox.NewRow, reserved: outbox.Reserved | None = None) -> int:
        """One outbox row; rows of one ``queue`` are delivered in order (docs/protocol.md §10).
        Returns its id, which the thread entry recording the send names."""
        retry_for = self.job.rt.config.server.retry_for
        item, head = outbox.queue_item(self.tx, row, self.now, self.now + retry_for, reserved)
        self.queued = True  # the job's Wakes: the outbox has work once it commits
        # Handed to the outbox with the wake while each is its queue's head; one behind
        # another is the outbox's to look for when the one before it is sent.
        self.handed = [*self.handed, item] if head and self.handed is not None else None
        return item.id

    def result(self) -> Applied:
        wakes = NO_WAKES
        if self.queued or self.deadline is not None:
            wakes = Wakes(self.queued, self.deadline, rows=tuple(self.handed or ()))
        return Applied(tuple(self.refusals), wakes, tuple(self.statuses))


def apply(
    job: Job,
    case: CaseView | None,
    effects: Iterable[Effect],
    *,
    quiet: bool = False,
    recorded: Recorded | None = None,
) -> Applied:
    """Carry out the engine's effects on ``case``; returns what was applied.

    ``case`` is None only for effects that concern no case yet
    (:class:`~masd.core.engine.OpenIntake`).  ``quiet``: statuses are not
    logged here, the caller's line names them (a contract message:
    :attr:`Applied.statuses`).  ``recorded``: the mail this job has just
    recorded, which a send may answer (:class:`Recorded`).
    """
    ap = _Applying(job, case, quiet, recorded)
    for effect in effects:
        _carry_out(ap, effect)
    return ap.result()


# --------------------------------------------------------------------------- one per effect


def _create_case(ap: _Applying, e: CreateCase) -> None:
    cases.create(ap.tx, e.case, ap.now)


def _thread(ap: _Applying, e: Thread) -> None:
    ap.thread(e.kind, dict(e.data))


def _open_handoff(ap: _Applying, e: OpenHandoff) -> None:
    webhook_url = e.url if e.peer.startswith("webhook:") else None
    new = handoffs.NewHandoff(
        e.handoff_id,
        ap.case.key,
        e.mode,
        e.peer,
        e.deadline_at,
        e.forwarded,
        webhook_url,
        e.details,
    )
    handoffs.open_handoff(ap.tx, new, ap.now)
    if e.deadline_at is not None and (ap.deadline is None or e.deadline_at < ap.deadline):
        ap.deadline = e.deadline_at


def _status(ap: _Applying, s: Status) -> None:
    case = ap.case
    terminal = MACHINE.is_terminal(s.status)
    new = handoffs.NewStatus(s.handoff_id, s.status, s.seq, s.source, s.fields, terminal)
    mode = handoffs.record_status(ap.tx, new, ap.now)
    entry: dict[str, Any] = {
        "handoff_id": s.handoff_id,
        "mode": mode,
        "status": s.status,
        "source": s.source,
    }
    if s.seq is not None:
        entry["seq"] = s.seq
    entry.update(s.fields)
    ap.thread("status", entry)
    ap.statuses.append(s)
    if ap.quiet:
        return
    log.info(
        "status case=%s handoff=%s status=%s seq=%s source=%s",
        case.key,
        s.handoff_id,
        s.status,
        shown(s.seq),
        s.source,
        extra={"case": case.key},
    )


def _send_contract(ap: _Applying, s: SendContract) -> None:
    case = ap.case
    message = dict(s.message)
    row = outbox.NewRow("contract", f"{case.key}|{s.peer}", s.peer, case.key, s.url, message)
    outbox_id = ap.queue(row)
    entry: dict[str, Any] = {"type": message["type"], "id": message["id"], "peer": s.peer}
    entry["handoff_id"] = s.handoff_id
    if "forwarded" in message:  # handoff.requested: was the request passed on
        entry["forwarded"] = message["forwarded"]
    entry["outbox_id"] = outbox_id
    ap.thread("contract.out", entry)


def _abandon_request(ap: _Applying, e: AbandonRequest) -> None:
    for outbox_id, mid in outbox.abandon_requests(ap.tx, ap.case.key, e.handoff_id, at=ap.now):
        ap.thread(
            "delivery.failed",
            {
                "outbox_id": outbox_id,
                "kind": "contract",
                "type": "handoff.request",
                "id": mid,
                "detail": "abandoned at the handoff's deadline (docs/protocol.md §12)",
            },
        )


def _open_intake(ap: _Applying, e: OpenIntake) -> None:
    messages.open_intake(
        ap.tx, e.intake_ref, e.domain, e.type, e.message_ref, e.requested_mode, ap.now
    )
    queue = f"intake:{e.intake_ref}|{e.master.peer}"
    ap.queue(outbox.NewRow("contract", queue, e.master.peer, None, e.master.url, e.message))


def _assign_intake(ap: _Applying, e: AssignIntake) -> None:
    messages.assign_intake(ap.tx, e.intake_ref, ap.case.key, ap.now)
    messages.move_to_case(ap.tx, e.message_ref, ap.case.key)


def _set_policy(ap: _Applying, e: SetPolicy) -> None:
    stored = {"autonomous_send": e.policy.autonomous_send, "transfers": e.policy.transfers}
    cases.set_policy(ap.tx, ap.case.key, stored)


def _send_mail_effect(ap: _Applying, s: SendMail) -> None:
    ap.refusals.append(_send_mail(ap, s))


# --------------------------------------------------------------------------- mail out


@dataclass(frozen=True)
class _Original:
    """The recorded mail a send answers: whom the send goes to, and how it threads."""

    message_ref: str
    recipient: Recipient
    message_id: str | None
    references: tuple[str, ...]
    subject: str | None


def _recipient(
    tx: Tx, case: CaseView, reply_to: str | None, recorded: Recorded | None = None
) -> _Original | None:
    if recorded is not None and recorded.case_key == case.key:
        ev = recorded.event
        # The very row the queries below would find: the mail reply_to names,
        # or the participant's latest mail on a case that has no other mail.
        if reply_to is not None:
            fresh = reply_to == ev.message_ref
        else:
            fresh = recorded.opened and case.participant == ev.from_address
        if fresh:
            recipient = Recipient(ev.from_address, ev.dmarc == "pass", ev.automated)
            return _Original(ev.message_ref, recipient, ev.message_id, ev.references, ev.subject)
    if reply_to is not None:
        sender = messages.on_case(tx, case.key, reply_to)
    else:
        # docs/protocol.md §5: replies thread to "the participant's latest mail on the case".
        sender = messages.latest_from(tx, case.key, case.participant)
    if sender is None:
        return None
    event = sender.event
    recipient = Recipient(
        address=sender.from_address,
        authenticated=event.get("auth", {}).get("dmarc") == "pass",
        automated=bool(event.get("automated", {}).get("is")),
    )
    return _Original(
        sender.message_ref,
        recipient,
        event.get("message_id"),
        tuple(event.get("references", [])),
        event.get("subject"),
    )


def _refusal(ap: _Applying, recipient: Recipient | None, purpose: str) -> str | None:
    """Principle 10's answer for a send to ``recipient``, then the bounces' (None: it
    may go)."""
    case = ap.case
    typ = ap.job.rt.type_config(case.domain, case.type)
    caps = Caps(typ.send_cap.per_case, typ.send_cap.per_recipient_per_day)
    # The counts feed only the caps, which decide_send checks last: a send
    # refused before any mail is counted is refused for the same reason
    # whatever the counts, so they are read only for a send that passed the
    # rules on who the recipient is (with the recipient's suppression, in the
    # same statement: a round trip where the store is across a network).
    refusal: str | None = decide_send(recipient, Counts(0, 0), caps)
    if refusal is None and recipient is not None:
        # Its id, asked with the standing read on PostgreSQL: the mail is queued whole.
        ap.reserved = outbox.reserve(ap.tx, _mail_queue(case))
        standing = cases.send_standing(
            ap.tx, case.key, recipient.address.lower(), ap.now - CAP_WINDOW_SECONDS
        )
        counts = Counts(case_sent=standing.case_sent, recipient_sent_24h=standing.recipient_sent)
        refusal = decide_send(recipient, counts, caps) or bounce_mail.suppression(
            purpose, standing.suppressed_until, ap.now
        )
    return refusal


def _mail_queue(case: CaseView) -> str:
    """The outbox queue of a case's mail: sent in the order it was queued."""
    return f"{case.key}|smtp"


def _send_mail(ap: _Applying, s: SendMail) -> str | None:
    """The one gate every outbound mail passes (docs/protocol.md §4.4, §4, §5);
    returns the send's refusal, or None when the mail was queued."""
    original = _recipient(ap.tx, ap.case, s.reply_to, ap.recorded)
    recipient = original.recipient if original is not None else None
    refusal = _refusal(ap, recipient, s.purpose)
    if refusal is not None or original is None or recipient is None:
        ap.thread(
            "mail.refused",
            {
                "reason": refusal,
                "purpose": s.purpose,
                "to": recipient.address if recipient else None,
                "reply_to": s.reply_to,
            },
        )
        # Routine (most senders are unauthenticated or automated); the thread
        # keeps it, and the LMTP or HTTP edge logs the input that caused it.
        log.debug("send refused case=%s purpose=%s reason=%s", ap.case.key, s.purpose, refusal)
        return refusal
    _queue_mail(ap, s, original)
    return None


def _queue_mail(ap: _Applying, s: SendMail, original: _Original) -> None:
    """Compose the mail that answers ``original``, queue it, count it, thread it."""
    case, to = ap.case, original.recipient.address
    refs = [*original.references, original.message_id]
    subject = s.subject or compose.reply_subject(original.subject)
    mid = compose.message_id(ap.job.rt.new_id(), case.domain)
    raw = compose.render(
        compose.OutboundMail(
            sender=case.address,
            to=to,
            subject=subject,
            body=s.body,
            message_id=mid,
            in_reply_to=original.message_id,
            references=[r for r in refs if r],
            auto_submitted=s.auto_submitted,
            date=ap.now,
        )
    )
    reserved, ap.reserved = ap.reserved, None
    if reserved is None:  # pragma: no cover - _refusal reserves for every send that passes
        raise RuntimeError(f"a mail to {to} on {case.key} passed with no outbox id reserved")
    # Its id known ahead, the mail is queued whole, its bounce address its envelope sender.
    outbox_id, _ = reserved.read()
    payload = {
        "mail_from": bounce_mail.envelope(ap.job.rt, ap.tx, case, outbox_id, ap.now),
        "rcpt_to": to,
        "domain": case.domain,
        "message": raw.decode("utf-8"),
    }
    ap.queue(outbox.NewRow("mail", _mail_queue(case), "smtp", case.key, None, payload), reserved)
    cases.count_send(ap.tx, case.key, to.lower(), ap.now)
    ap.thread(
        "mail.out",
        {
            "message_id": mid,
            "to": to,
            "purpose": s.purpose,
            "subject": compose.clean_header(subject),
            "in_reply_to": original.message_ref,
            "auto_submitted": s.auto_submitted,
            "body": s.body,
            "outbox_id": outbox_id,
        },
    )
    # The outbox logs the attempt to send it (``outbox sent|retry|gave-up``).
    log.debug("mail queued case=%s purpose=%s message_id=%s", case.key, s.purpose, mid)


def _carry_out(ap: _Applying, effect: Effect) -> None:
    """One effect, by its kind.  The match is exhaustive: an effect added to
    :data:`~masd.core.engine.Effect` with no case here fails mypy at
    ``assert_never`` (tests/test_effects_exhaustive.py)."""
    match effect:
        case CreateCase():
            _create_case(ap, effect)
        case Thread():
            _thread(ap, effect)
        case OpenHandoff():
            _open_handoff(ap, effect)
        case Status():
            _status(ap, effect)
        case SendContract():
            _send_contract(ap, effect)
        case SendMail():
            _send_mail_effect(ap, effect)
        case AbandonRequest():
            _abandon_request(ap, effect)
        case OpenIntake():
            _open_intake(ap, effect)
        case AssignIntake():
            _assign_intake(ap, effect)
        case SetPolicy():
            _set_policy(ap, effect)
        case _:
            assert_never(effect)
