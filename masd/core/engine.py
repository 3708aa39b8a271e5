"""The role engine: pure decisions from (state, input, now) to effects.

masd's edges turn what happens outside (a mail over LMTP, a contract message
over HTTP, a deadline, an outbox delivery that failed) into an *input*, load
the case's *state* from the store, and call one function of this module.  It
answers with *effects*: plain values saying what to record and what to send.
The store applies them in the same transaction that recorded the input, so
an input and all its effects are committed together or not at all.

Nothing here does I/O, reads a clock or draws random numbers: ``now`` and
fresh ids come in through :class:`Context`.

Effects::

    CreateCase      a new case (and its address)
    Thread          an entry in the case's thread (docs/protocol.md §16 kinds)
    OpenHandoff     a new handoff, its mode endpoint and deadline
    Status          a handoff status, checked against the table (docs/protocol.md §14)
    SendContract    a contract message into the outbox (docs/protocol.md §10)
    SendMail        a mail to a recorded sender, through Principle 10 (docs/protocol.md §4.4)
    AbandonRequest  give up an undelivered handoff.request (docs/protocol.md §12)
    OpenIntake      a slave-role intake, reported to the master (docs/protocol.md §13.1)
    AssignIntake    the intake's mail becomes the assigned case's first (docs/protocol.md §13)
    SetPolicy       a slave case's policy (docs/protocol.md §13.3-§13.4, §13)

This module holds the state and effect types, the master role, and who may
act on what; the slave role is :mod:`masd.core.slave`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from masd.core import texts
from masd.core.address import Address
from masd.core.details import find_fields
from masd.core.errors import Answer, WireError
from masd.core.event import ParsedMail
from masd.core.kinds import ThreadKind
from masd.core.status import MACHINE
from masd.core.times import rfc3339
from masd.core.wire import CaseRef, HandoffStatus, envelope

# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class HandoffView:
    """A handoff as the store has it."""

    handoff_id: str
    case_key: str
    mode: str
    peer: str  # the peer it was sent to: only that peer may post its statuses
    url: str | None
    status: str
    last_seq: int | None
    needs: tuple[str, ...] = ()
    forwarded: bool = True

    @property
    def closed(self) -> bool:
        return MACHINE.is_terminal(self.status)


@dataclass(frozen=True)
class CaseView:
    """A case as the store has it, with its open handoff if any."""

    key: str
    address: str
    domain: str
    type: str
    id: str
    role: Literal["master", "slave"]
    participant: str
    open_handoff: HandoffView | None = None

    @property
    def ref(self) -> CaseRef:
        return CaseRef(self.address, self.key)


@dataclass(frozen=True)
class EndpointView:
    """What the engine needs of a configured mode endpoint."""

    peer: str
    url: str
    deadline: float
    fields: tuple[str, ...]


@dataclass(frozen=True)
class TypeView:
    """What the engine needs of a resource type's configuration."""

    role: Literal["master", "slave"]
    modes: frozenset[str]
    endpoints: Mapping[str, EndpointView]
    acknowledge: bool
    require_dmarc_for_handoff: bool
    id_prefix: str


@dataclass(frozen=True)
class Context:
    """Everything from outside the input: the time, fresh ids, where statuses go."""

    now: float
    new_id: Callable[[], str]  # a fresh random id (handoff ids, message ids)
    status_url: str


@dataclass(frozen=True)
class Peer:
    """A peer to send to: its id (for credentials and ordering) and URL."""

    peer: str
    url: str


@dataclass(frozen=True)
class PolicyView:
    """A slave case's policy (docs/protocol.md §13.3-§13.4, §13)."""

    autonomous_send: bool
    transfers: str  # "block", or the webhook URL

    def to_json(self) -> dict[str, Any]:
        transfers: Any = "block" if self.transfers == "block" else {"webhook": self.transfers}
        return {"autonomous_send": self.autonomous_send, "transfers": transfers}


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class CreateCase:
    case: CaseView


@dataclass(frozen=True)
class Thread:
    kind: ThreadKind
    data: Mapping[str, Any]


@dataclass(frozen=True)
class OpenHandoff:
    handoff_id: str
    mode: str
    peer: str
    url: str | None
    deadline_at: float | None
    details: Mapping[str, str]
    forwarded: bool = True


@dataclass(frozen=True)
class Status:
    handoff_id: str
    status: str
    seq: int | None
    source: Literal["email", "mode"]
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SendContract:
    peer: str
    url: str
    message: Mapping[str, Any]
    handoff_id: str | None = None


@dataclass(frozen=True)
class SendMail:
    """A mail to the sender of a recorded message (the participant's latest
    mail on the case when ``reply_to`` is None).  ``auto_submitted`` marks
    mails email writes itself (docs/protocol.md §5)."""

    purpose: Literal["acknowledge", "question", "resume", "reply"]
    body: str
    subject: str | None = None
    reply_to: str | None = None
    auto_submitted: bool = True


@dataclass(frozen=True)
class AbandonRequest:
    handoff_id: str


@dataclass(frozen=True)
class OpenIntake:
    """A mail to a slave-role intake address, pending until the master assigns
    it a case; ``message`` (the case.intake) goes to ``master``."""

    intake_ref: str
    message_ref: str  # the mail, recorded by the caller under intake_ref
    domain: str
    type: str
    requested_mode: str | None
    master: Peer
    message: Mapping[str, Any]


@dataclass(frozen=True)
class AssignIntake:
    """Intake ``intake_ref`` is assigned to the case; its mail ``message_ref`` joins it."""

    intake_ref: str
    message_ref: str


@dataclass(frozen=True)
class SetPolicy:
    policy: PolicyView


Effect = (
    CreateCase
    | Thread
    | OpenHandoff
    | Status
    | SendContract
    | SendMail
    | AbandonRequest
    | OpenIntake
    | AssignIntake
    | SetPolicy
)


@dataclass(frozen=True)
class Reply:
    """A contract answer: its kind (``ok``, or ``refused`` under Principle 10), its body,
    and the effects behind it.  The edge that carries it gives the kind its status."""

    kind: Answer
    body: Mapping[str, Any]
    effects: Sequence[Effect] = ()


OK: Mapping[str, Any] = {"ok": True}
STALE: Mapping[str, Any] = {"ok": True, "ignored": "stale"}


# --------------------------------------------------------------------------- helpers


def same_address(a: str, b: str) -> bool:
    """Mail addresses compared as masd records them (case-insensitive)."""
    return a.strip().lower() == b.strip().lower()


def mail_in(mail: ParsedMail, requested_mode: str | None) -> Thread:
    """The thread entry of an inbound mail (docs/protocol.md §16 ``mail.in``)."""
    ev = mail.event
    entry: dict[str, Any] = {
        "message_ref": ev.message_ref,
        "from": ev.from_address,
        "subject": ev.subject,
        "dmarc": ev.dmarc,
        "automated": mail.automation.is_automated,
    }
    if requested_mode:
        entry["requested_mode"] = requested_mode
    return Thread("mail.in", entry)


def may_steer(mail: ParsedMail, case: CaseView | None, typ: TypeView) -> bool:
    """docs/protocol.md §4: "Steering a case needs an authenticated, non-automated
    sender. A !MODE request from anyone else, or on an existing case from
    anyone but its participant, is recorded and refused with reason blocked"."""
    if mail.automation.is_automated:
        return False
    if typ.require_dmarc_for_handoff and not mail.auth.authenticated:
        return False
    return case is None or same_address(mail.event.from_address, case.participant)


# --------------------------------------------------------------------------- master role


def master_mail(
    case: CaseView | None,
    address: Address,
    mail: ParsedMail,
    typ: TypeView,
    ctx: Context,
    *,
    new_case_id: str,
) -> list[Effect]:
    """A mail delivered to a master-role address (docs/protocol.md §11, §3-§6).

    ``case`` is None for an intake address (``type@D``, ``type!mode@D``): the
    mail opens a new case ``<id_prefix><n>`` (``new_case_id``) whose
    participant is the mail's From.  For ``type=id@D`` the edge has already
    refused a case that does not exist (``550 5.1.1``).
    """
    effects: list[Effect] = []
    ev = mail.event
    opened = case is None
    if case is None:
        resource = address.with_id(new_case_id)
        case = CaseView(
            key=resource.key,
            address=resource.canonical,
            domain=resource.domain,
            type=resource.type,
            id=new_case_id,
            role="master",
            participant=ev.from_address,
        )
        effects.append(CreateCase(case))
    effects.append(mail_in(mail, address.mode))

    notice: str | None = None  # a resume notice to send at once (refused on the spot)
    if address.mode:
        handoff_effects, notice = _master_request(case, address.mode, mail, typ, ctx, opened=opened)
        effects += handoff_effects
    elif not opened:
        effects += negotiation_reply(case, mail)

    # docs/protocol.md §5: "When a !MODE intake is refused on the spot, the
    # acknowledgement and the resume notice are one mail."
    if opened and typ.acknowledge:
        effects.append(SendMail("acknowledge", texts.acknowledge(case.address, notice)))
    elif notice is not None:
        effects.append(SendMail("resume", notice))
    return effects


def _master_request(
    case: CaseView, mode: str, mail: ParsedMail, typ: TypeView, ctx: Context, *, opened: bool
) -> tuple[list[Effect], str | None]:
    """``!MODE`` in the master role (docs/protocol.md §11.1); returns effects and a resume
    notice.
    """
    if case.open_handoff is not None:
        # One open handoff per case: the request is on the thread (mail.in
        # carries requested_mode) and starts nothing.
        return [], None
    handoff_id = ctx.new_id()
    reason: str | None = None
    if not may_steer(mail, None if opened else case, typ):
        reason = "blocked"
    elif mode not in typ.modes:
        reason = "mode-not-enabled"  # the statute does not list it
    elif mode not in typ.endpoints:
        reason = "mode-unavailable"  # listed, but no endpoint configured
    if reason is not None:
        # "email records a refused status itself and continues by email".
        # The table starts every handoff at requested, so the refusal is
        # recorded as requested -> refused, both by email.
        effects: list[Effect] = [
            OpenHandoff(handoff_id, mode, peer="email", url=None, deadline_at=None, details={}),
            Status(handoff_id, "requested", None, "email"),
            Status(handoff_id, "refused", None, "email", {"reason": reason}),
        ]
        return effects, texts.resume(case.address, mode, "refused", {"reason": reason})
    endpoint = typ.endpoints[mode]
    deadline_at = ctx.now + endpoint.deadline
    details, message = handoff_request(
        case, handoff_id, mode, mail, endpoint.fields, ctx, deadline_at=deadline_at
    )
    return [
        OpenHandoff(handoff_id, mode, endpoint.peer, endpoint.url, deadline_at, details),
        Status(handoff_id, "requested", None, "email"),
        SendContract(endpoint.peer, endpoint.url, message, handoff_id),
    ], None


def handoff_request(
    case: CaseView,
    handoff_id: str,
    mode: str,
    mail: ParsedMail,
    fields: tuple[str, ...],
    ctx: Context,
    *,
    deadline_at: float | None = None,
) -> tuple[dict[str, str], dict[str, Any]]:
    """docs/protocol.md §8 handoff.request; docs/protocol.md §6: "details holds subject and each
    field of the endpoint's fields list found in the mail's text".  ``deadline_at`` (the
    master role's handoffs have one) is sent as RFC 3339, an added field (docs/protocol.md §8.6)."""
    details = {"subject": mail.event.subject or ""}
    details.update(find_fields(mail.event.reply_text, fields))
    message = envelope(
        "handoff.request",
        ctx.new_id(),
        case.ref,
        handoff_id=handoff_id,
        mode=mode,
        details=details,
        status_url=ctx.status_url,
        participant={"address": case.participant},
    )
    if deadline_at is not None:
        message["deadline_at"] = rfc3339(deadline_at)
    return details, message


def negotiation_reply(case: CaseView, mail: ParsedMail) -> list[Effect]:
    """docs/protocol.md §11.4: "A reply on the case address that supplies them is
    sent to the mode as handoff.update."  docs/protocol.md §4: only "when it comes from
    the participant and passed DMARC"."""
    h = case.open_handoff
    if h is None or h.status != "negotiating" or not h.needs or h.url is None:
        return []
    if not mail.auth.authenticated or mail.automation.is_automated:
        return []
    if not same_address(mail.event.from_address, case.participant):
        return []
    details = find_fields(mail.event.reply_text, h.needs)
    if not details:
        return []
    return [
        SendContract(h.peer, h.url, _update(case, h, details, mail.event.message_ref), h.handoff_id)
    ]


def _update(case: CaseView, h: HandoffView, details: Mapping[str, str], mid: str) -> dict[str, Any]:
    # The update's id derives from the message it carries, so a mail recorded
    # once yields one update.
    return envelope(
        "handoff.update", f"upd-{mid}", case.ref, handoff_id=h.handoff_id, details=dict(details)
    )


def status_from_mode(
    case: CaseView,
    handoff: HandoffView,
    msg: HandoffStatus,
    *,
    resume: bool,
    ask: bool | None = None,
    relay: Peer | None = None,
) -> Reply:
    """A ``handoff.status`` from the peer the handoff was sent to (docs/protocol.md §7, §14).

    ``resume``: email mails the participant on a terminal status (the master
    role, docs/protocol.md §11.3).  ``ask``: email mails the negotiation question
    (the master role, or a slave case with autonomous_send; defaults to
    ``resume``).  ``relay``: the outside master every status is relayed to
    (the slave role, docs/protocol.md §13.4).
    """
    # docs/protocol.md §7: "A receiver MUST ignore a status whose seq is not greater
    # than the last one it accepted".  docs/protocol.md §9 puts this before the
    # transition check.
    if handoff.last_seq is not None and msg.seq <= handoff.last_seq:
        return Reply("ok", STALE)
    # docs/protocol.md §14: "A receiver MUST refuse a transition that the table does
    # not allow"; a mode is never the timeout owner (in the slave role,
    # "Email sets no deadline and never records timed-out").
    MACHINE.check(handoff.status, msg.status, source="mode", timeout_owner=False)
    fields = msg.fields()
    effects: list[Effect] = [Status(handoff.handoff_id, msg.status, msg.seq, "mode", fields)]
    if relay is not None:
        # The relay keeps the mode's seq: the master orders statuses by it.
        # Its id is email's own, derived so a status relayed twice is one.
        relayed = envelope(
            "handoff.status",
            f"relay-{handoff.handoff_id}-{msg.seq}",
            case.ref,
            handoff_id=handoff.handoff_id,
            seq=msg.seq,
            status=msg.status,
            **fields,
        )
        effects.append(SendContract(relay.peer, relay.url, relayed, handoff.handoff_id))
    if resume and MACHINE.is_terminal(msg.status):
        # docs/protocol.md §11.3: "On every terminal status, email resumes".
        text = texts.resume(case.address, handoff.mode, msg.status, fields)
        effects.append(SendMail("resume", text))
    elif (resume if ask is None else ask) and msg.status == "negotiating" and msg.needs:
        text = texts.question(case.address, handoff.mode, msg.needs, msg.detail)
        effects.append(SendMail("question", text))
    return Reply("ok", OK, effects)


def master_deadline(case: CaseView, handoff: HandoffView, ctx: Context) -> list[Effect]:
    """docs/protocol.md §12: "At the deadline with no terminal status: record timed-out;
    a handoff.request still undelivered is abandoned ... and the
    handoff.cancel with reason: "timed-out" goes out after it; mail the
    participant."""
    if handoff.closed:
        return []
    MACHINE.check(handoff.status, "timed-out", source="email", timeout_owner=True)
    effects: list[Effect] = [
        Status(handoff.handoff_id, "timed-out", None, "email"),
        AbandonRequest(handoff.handoff_id),
    ]
    if handoff.url is not None:
        cancel = envelope(
            "handoff.cancel",
            f"cancel-{handoff.handoff_id}",
            case.ref,
            handoff_id=handoff.handoff_id,
            reason="timed-out",
        )
        effects.append(SendContract(handoff.peer, handoff.url, cancel, handoff.handoff_id))
    effects.append(SendMail("resume", texts.resume(case.address, handoff.mode, "timed-out", {})))
    return effects


def request_failed(case: CaseView, handoff: HandoffView, detail: str) -> list[Effect]:
    """docs/protocol.md §10: "a refused handoff.request records failed with the detail
    and resumes by email" (also when retries ran out).

    A mode that already posted a status the table does not let ``failed``
    follow (negotiating, scheduled) has the handoff anyway: the failed
    delivery stays on the thread and the handoff as it is.
    """
    if handoff.closed or "failed" not in MACHINE.allowed(handoff.status):
        return []
    fields = {"detail": detail[:1024]}
    return [
        Status(handoff.handoff_id, "failed", None, "email", fields),
        SendMail("resume", texts.resume(case.address, handoff.mode, "failed", fields)),
    ]


# --------------------------------------------------------------------------- who may act


class Caller(Protocol):
    """Who a contract message's secret authenticated.

    (:class:`masd.service.peer_directory.Principal`.)
    """

    def covers(self, peer_id: str) -> bool:
        """The secret is the one of peer ``peer_id``."""

    def serves(self, domain: str, type_: str) -> bool:
        """The secret is the one of a peer configured for ``type_`` at ``domain``."""


def _forbidden(detail: str) -> WireError:
    return WireError(detail, code="forbidden")


def authorize_status(who: Caller, handoff: HandoffView) -> None:
    """docs/protocol.md §9: "a mode may post statuses only for handoffs sent to it"; the
    handoff records its peer, so a status from any other is ``forbidden``."""
    if not who.covers(handoff.peer):
        raise _forbidden(f"handoff_id: {handoff.handoff_id} was not sent to this peer")


def authorize_master(who: Caller, case: CaseView) -> None:
    """docs/protocol.md §9: "a master may send only master messages, only for its own
    domain and types": a case it may act on is a slave-role case of its type."""
    if case.role != "slave" or not who.serves(case.domain, case.type):
        raise _forbidden(f"case: {case.key} is not a case of this master")


def authorize_assign(who: Caller, intake_ref: str, domain: str, type_: str) -> None:
    """case.assign: only the master of the intake's domain and type names its case."""
    if not who.serves(domain, type_):
        raise _forbidden(f"intake_ref: {intake_ref} is not an intake of this master")
