"""The slave role: pure decisions for cases an outside master owns (docs/protocol.md §13).

In this role email records and reports; the master names the cases
(``case.assign``), sets each case's policy (``case.policy``) and decides
what is sent (``mail.send``).  Like :mod:`masd.core.engine`, whose state and
effect types it uses, nothing here does I/O: every function maps (state,
input, context) to effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from masd.core import texts
from masd.core.address import Address
from masd.core.engine import (
    OK,
    AssignIntake,
    CaseView,
    Context,
    CreateCase,
    Effect,
    HandoffView,
    OpenHandoff,
    OpenIntake,
    Peer,
    PolicyView,
    Reply,
    SendContract,
    SendMail,
    SetPolicy,
    Status,
    Thread,
    TypeView,
    handoff_request,
    mail_in,
    may_steer,
    negotiation_reply,
)
from masd.core.errors import WireError
from masd.core.event import ParsedMail
from masd.core.status import MACHINE
from masd.core.wire import CaseAssign, HandoffCancel, PolicyPatch, envelope


@dataclass(frozen=True)
class Transfer:
    """Where a slave case's policy sends a handoff: the webhook peer and its fields."""

    peer: str
    url: str  # the URL the policy names (under the configured webhook's URL)
    fields: tuple[str, ...]


@dataclass(frozen=True)
class SlaveTerms:
    """What governs a slave case besides its state.

    ``policy``: the case's, as the master set it over the type's defaults.
    ``master``: who every report goes to.  ``transfer``: the configured
    webhook the policy's transfers URL falls under (None: block, or none).
    ``require_dmarc``: the type's ``require_dmarc_for_handoff``.
    """

    policy: PolicyView
    master: Peer
    transfer: Transfer | None
    require_dmarc: bool


# --------------------------------------------------------------------------- mail in


def slave_intake(address: Address, mail: ParsedMail, ctx: Context, *, master: Peer) -> OpenIntake:
    """A mail to a slave-role intake address (``type@D``, ``type!mode@D``).

    docs/protocol.md §13.1: "Email MUST NOT invent case identifiers in this role.
    Until assigned, the intake stays pending."  The mail is reported to the
    master as case.intake under a fresh ``intake_ref``; nothing else happens.
    """
    ev = mail.event
    intake_ref = f"intake-{ctx.new_id()}"
    message = intake_message(
        f"intake-{ev.message_ref}", intake_ref, address.type, ev.to_json(), address.mode
    )
    return OpenIntake(
        intake_ref, ev.message_ref, address.domain, address.type, address.mode, master, message
    )


def intake_message(
    message_id: str,
    intake_ref: str,
    type_: str,
    event: Mapping[str, Any],
    requested_mode: str | None,
) -> dict[str, Any]:
    """The ``case.intake`` of an intake (docs/protocol.md §13.1)."""
    message = envelope(
        "case.intake",
        message_id,
        None,
        intake_ref=intake_ref,
        resource_type=type_,
        event=dict(event),
    )
    # docs/protocol.md §13: "case.intake carries requested_mode always, null when none".
    message["requested_mode"] = requested_mode
    return message


def intake_again(intake: IntakeView, fresh: str) -> dict[str, Any]:
    """The ``case.intake`` of a pending intake sent again (``masd intake resend``): the
    same report under a fresh ``id`` (``fresh``: new random text), so a master that keeps
    the ids it has seen does not take it for the one it lost."""
    return intake_message(
        f"intake-{intake.message_ref}-{fresh}"[:128],
        intake.intake_ref,
        intake.type,
        intake.event,
        intake.requested_mode,
    )


def case_message(case: CaseView, message_ref: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """docs/protocol.md §13.2: "Inbound mail on a case is reported as case.message"."""
    return envelope(
        "case.message", f"msg-{message_ref}", case.ref, event=dict(event), message_ref=message_ref
    )


def slave_mail(
    case: CaseView, address: Address, mail: ParsedMail, terms: SlaveTerms, ctx: Context
) -> list[Effect]:
    """A mail on an assigned slave case: recorded, reported, and a ``!MODE`` handled."""
    ev = mail.event
    master = terms.master
    effects: list[Effect] = [
        mail_in(mail, address.mode),
        SendContract(master.peer, master.url, case_message(case, ev.message_ref, ev.to_json())),
    ]
    if address.mode:
        effects += slave_request(case, address.mode, mail, terms, ctx)
    elif terms.policy.autonomous_send:
        # docs/protocol.md §6: "In the slave role without autonomous_send, email asks
        # nothing and sends no handoff.update".
        effects += negotiation_reply(case, mail)
    return effects


def _requested(
    case: CaseView, handoff_id: str, mode: str, master: Peer, forwarded: bool, **extra: Any
) -> SendContract:
    """docs/protocol.md §13.4: the master hears of every ``!MODE`` as handoff.requested."""
    message = envelope(
        "handoff.requested",
        f"req-{handoff_id}",
        case.ref,
        handoff_id=handoff_id,
        mode=mode,
        forwarded=forwarded,
        **extra,
    )
    return SendContract(master.peer, master.url, message, handoff_id)


def slave_request(
    case: CaseView, mode: str, mail: ParsedMail, terms: SlaveTerms, ctx: Context
) -> list[Effect]:
    """``!MODE`` on a slave case, under its policy (docs/protocol.md §13.4, §13).

    ``mail`` is the mail that asked (for an intake, read again from the
    store when the case is assigned).  "The type's modes list
    does not apply to slave types: any well-formed !MODE goes to the master
    under the case's policy."
    """
    if case.open_handoff is not None:
        return []  # one open handoff per case
    handoff_id, master, transfer = ctx.new_id(), terms.master, terms.transfer
    typ = TypeView("slave", frozenset(), {}, False, terms.require_dmarc, "")
    if not may_steer(mail, case, typ):
        # docs/protocol.md §4's steering rule holds in both roles: recorded and
        # refused with reason blocked; the master learns it was not forwarded.
        return [
            OpenHandoff(handoff_id, mode, "email", None, None, details={}, forwarded=False),
            Status(handoff_id, "requested", None, "email"),
            Status(handoff_id, "refused", None, "email", {"reason": "blocked"}),
            _requested(case, handoff_id, mode, master, False, reason="blocked"),
        ]
    if terms.policy.transfers == "block" or transfer is None:
        # docs/protocol.md §13.4: "With block, a !MODE request is reported as
        # handoff.requested with "forwarded": false, and nothing else happens."
        # No handoff is opened: the request has no status, never counts as
        # the case's open handoff, and the next request is decided under the
        # policy of its own time.  Its handoff_id lives on in the thread's
        # contract.out entry (with forwarded false), which is what a
        # master's cancel naming it is matched against (cancel_from_master).
        return [_requested(case, handoff_id, mode, master, False)]
    details, request = handoff_request(case, handoff_id, mode, mail, transfer.fields, ctx)
    # No deadline: "Timeouts belong to the master" (docs/protocol.md §13.5).
    return [
        OpenHandoff(handoff_id, mode, transfer.peer, transfer.url, None, details, forwarded=True),
        Status(handoff_id, "requested", None, "email"),
        SendContract(transfer.peer, transfer.url, request, handoff_id),
        _requested(case, handoff_id, mode, master, True),
    ]


# --------------------------------------------------------------------------- the master's messages


def patched(policy: PolicyView, patch: PolicyPatch | None) -> PolicyView:
    """docs/protocol.md §13: "case.policy changes only the fields it carries"."""
    if patch is None:
        return policy
    return PolicyView(
        policy.autonomous_send if patch.autonomous_send is None else patch.autonomous_send,
        policy.transfers if patch.transfers is None else patch.transfers,
    )


@dataclass(frozen=True)
class IntakeView:
    """A pending (or assigned) intake as the store has it, with its mail's event."""

    intake_ref: str
    domain: str
    type: str
    requested_mode: str | None
    case_key: str | None  # the case it was assigned to, if any
    message_ref: str
    from_address: str | None
    event: Mapping[str, Any]  # the recorded GatewayEvent, as JSON


def assigned_before(intake: IntakeView, key: str, ref: Mapping[str, str]) -> Reply | None:
    """case.assign of an intake already assigned: the same assignment again is
    answered as the first was; another case is ``already-assigned``."""
    if intake.case_key is None:
        return None
    if intake.case_key == key:
        return Reply("ok", {"ok": True, "case": dict(ref)})
    raise WireError(
        f"intake_ref: {intake.intake_ref} is already assigned to {intake.case_key}",
        code="already-assigned",
    )


def assigned_case(address: Address, resource_id: str, intake: IntakeView) -> CaseView:
    """The case a case.assign creates: ``address`` (``TYPE=ID@D`` with the id
    as assigned), its participant the sender of the intake's mail."""
    return CaseView(
        key=address.key,
        address=address.canonical,
        domain=intake.domain,
        type=intake.type,
        id=resource_id,
        role="slave",
        participant=intake.from_address or "",
    )


def _assigned_mail_in(intake: IntakeView) -> Thread:
    """The intake's mail on the case's thread, where it now begins."""
    event = intake.event
    entry: dict[str, Any] = {
        "message_ref": intake.message_ref,
        "from": intake.from_address,
        "subject": event.get("subject"),
        "dmarc": event.get("auth", {}).get("dmarc"),
        "automated": bool(event.get("automated", {}).get("is")),
        "intake_ref": intake.intake_ref,
    }
    if intake.requested_mode:
        entry["requested_mode"] = intake.requested_mode
    return Thread("mail.in", entry)


def case_assigned(
    case: CaseView,
    intake: IntakeView,
    msg: CaseAssign,
    terms: SlaveTerms,
    ctx: Context,
    *,
    opened: bool,
    mail: ParsedMail | None,
) -> list[Effect]:
    """docs/protocol.md §13.1: the master names the case; email adopts ``TYPE=ID@D``.

    ``opened``: the case is new (else the id names a case already there,
    which takes the intake too).  ``terms``: the case's, its policy with the
    message's patch applied.  ``mail``: the intake's mail, parsed again, when
    it asked for a mode.
    """
    policy = terms.policy
    effects: list[Effect] = [CreateCase(case)] if opened else []
    if opened or msg.policy is not None:
        effects.append(SetPolicy(policy))
    effects += [
        # docs/protocol.md §13: "On case.assign the intake's message becomes the case's
        # first message: mail.send may answer it."
        AssignIntake(intake.intake_ref, intake.message_ref),
        _assigned_mail_in(intake),
        Thread("contract.in", {"type": "case.assign", "id": msg.id}),
    ]
    if policy.autonomous_send:
        # docs/protocol.md §13.3: with autonomous_send, email "MAY also send
        # acknowledgements".
        text = texts.acknowledge(case.address)
        effects.append(SendMail("acknowledge", text, reply_to=intake.message_ref))
    if intake.requested_mode and mail is not None:
        # "A mode requested in the intake mail (requested_mode) is handled
        # under that policy once the case exists."
        effects += slave_request(case, intake.requested_mode, mail, terms, ctx)
    return effects


#: The answer to a master's cancel of a request that opened no handoff.
NOT_FORWARDED: Mapping[str, Any] = {"ok": True, "ignored": "not-forwarded"}


def cancel_from_master(
    case: CaseView,
    handoff: HandoffView | None,
    msg: HandoffCancel,
    ctx: Context,
    *,
    reported: bool = False,
) -> Reply:
    """The master's ``handoff.cancel`` (docs/protocol.md §13.5).

    ``handoff``: the case's handoff the message names, None when the case
    has no handoff by that id.  ``reported``: then, whether that id is one
    masd gave a ``!MODE`` it reported to the master as handoff.requested
    (its ``contract.out`` entry is on the case's thread).

    On a handoff that is not terminal: record ``cancelled``, pass the cancel
    on to the webhook the handoff was forwarded to, answer ``{"ok": true}``.
    On a terminal one: ``invalid-transition``, nothing passed on.
    """
    if handoff is None:
        if reported:
            # A request reported with forwarded false under transfers
            # "block" opened no handoff: there is nothing to end and nobody
            # to tell.  The cancel stays on the thread (the caller's
            # contract.in entry) and is answered as ignored, not refused:
            # the master named an id masd gave it (docs/protocol.md §13.4).
            return Reply("ok", NOT_FORWARDED)
        raise WireError(
            f"handoff_id: no handoff {msg.handoff_id} on case {case.key}", code="unknown-handoff"
        )
    if handoff.closed:
        raise WireError(
            f'handoff_id: {handoff.handoff_id} is already "{handoff.status}"; '
            "nothing follows a terminal status",
            code="invalid-transition",
        )
    MACHINE.check(handoff.status, "cancelled", source="email")
    effects: list[Effect] = [
        Status(handoff.handoff_id, "cancelled", None, "email", {"reason": msg.reason})
    ]
    if handoff.forwarded and handoff.url is not None:
        fwd = envelope(
            "handoff.cancel",
            f"cancel-{handoff.handoff_id}",
            case.ref,
            handoff_id=handoff.handoff_id,
            reason=msg.reason,
        )
        effects.append(SendContract(handoff.peer, handoff.url, fwd, handoff.handoff_id))
    return Reply("ok", OK, effects)


# --------------------------------------------------------------------------- outbox failures


def slave_request_failed(
    case: CaseView, handoff: HandoffView, detail: str, *, master: Peer
) -> list[Effect]:
    """A ``handoff.request`` to a webhook that was refused (4xx) or never got through.

    docs/protocol.md §10 records ``failed`` with the detail.  The master role then
    resumes by mail; the slave role may not: "Email sends only on mail.send
    from the master, unless the case policy ... sets autonomous_send: true.
    Then email MAY also send acknowledgements and negotiation questions"
    (docs/protocol.md §13.3), and a resume notice is neither.  The master, who owns
    the control flow, learns it as the handoff's next status, relayed like
    every other (docs/protocol.md §13.4), with the seq after the last one accepted.
    A webhook that has posted statuses the table does not let ``failed``
    follow (negotiating, scheduled) has the handoff anyway: the failed delivery
    is on the thread, the handoff stays as it is.
    """
    if handoff.closed or "failed" not in MACHINE.allowed(handoff.status):
        return []
    fields = {"detail": detail[:1024]}
    seq = (handoff.last_seq or 0) + 1
    relayed = envelope(
        "handoff.status",
        f"relay-{handoff.handoff_id}-{seq}",
        case.ref,
        handoff_id=handoff.handoff_id,
        seq=seq,
        status="failed",
        **fields,
    )
    return [
        Status(handoff.handoff_id, "failed", None, "email", fields),
        SendContract(master.peer, master.url, relayed, handoff.handoff_id),
    ]
