"""Contract messages in: what the HTTP edge received, past authentication (docs/protocol.md §9).

:func:`receive` keeps every answer per (peer, id) and hands the message to
the handler its type names in :data:`HANDLERS`.  Each handler loads what the
message is about, asks the engine, and has :func:`~masd.service.apply.apply`
carry out the effects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from masd.config import webhook_for
from masd.core.address import check_id, parse_address
from masd.core.engine import (
    OK,
    CaseView,
    HandoffView,
    Reply,
    SendMail,
    SetPolicy,
    Status,
    authorize_assign,
    authorize_master,
    authorize_status,
    status_from_mode,
)
from masd.core.errors import Answer, MasdError, TransitionError, WireError
from masd.core.event import ParsedMail, build_event
from masd.core.slave import (
    assigned_before,
    assigned_case,
    cancel_from_master,
    case_assigned,
    patched,
)
from masd.core.wire import (
    CaseAssign,
    CasePolicy,
    Envelope,
    HandoffCancel,
    HandoffStatus,
    MailSend,
    PolicyPatch,
    decode,
)
from masd.service.apply import NOTHING, Applied, apply
from masd.service.peer_directory import Principal
from masd.service.runtime import NO_WAKES, Job, Runtime, Wakes
from masd.service.state import load_case, named_handoff, policy_of
from masd.store import Tx, append_thread, cases, idempotency, messages, savepoint, thread

log = logging.getLogger("masd")

#: A handler's answer, and what applying its effects did.
Handled = tuple[Reply, Applied]


#: The status the edge answers a kind with (:data:`masd.edges.http.shared.status_of`):
#: the service keeps it with the answer, so a repeat gets the original one.
StatusOf = Callable[[Answer], int]


@dataclass(frozen=True)
class Received:
    """The answer to a contract message, and what its store job wrote.

    ``status`` is what :data:`StatusOf` gave the answer's kind, or what was kept
    for a repeated (peer, id).
    """

    status: int
    body: Mapping[str, Any]
    wakes: Wakes = NO_WAKES
    #: The handoff statuses the message recorded, in order: the edge's one
    #: log line for the message names them (apply does not, for a message).
    statuses: tuple[Status, ...] = ()


def receive(
    rt: Runtime, tx: Tx, who: Principal, env: Envelope, now: float, status_of: StatusOf
) -> Received:
    """A contract message that passed authentication and the envelope checks.

    docs/protocol.md §9 order from here: idempotency, schema, unknown case/handoff,
    forbidden, stale seq, invalid transition.  Every answer but a 5xx is
    kept for the (peer, id), so a repeat gets the original status and body.
    """
    answered = idempotency.answered(tx, who.id, env.id)
    if answered is not None:
        return Received(*answered)
    job = Job(rt, tx, now)
    try:
        # A refusal leaves nothing behind but its idempotency row: whatever
        # the handler recorded before refusing is undone with the savepoint.
        with savepoint(tx):
            msg = decode(env)
            reply, applied = HANDLERS[env.type](job, who, env, msg)
    except (WireError, TransitionError) as exc:
        status = status_of(exc.code)
        body: dict[str, Any] = {"ok": False, "error": exc.code, "detail": exc.detail}
        idempotency.keep(tx, who.id, env.id, status, body, now)
        return Received(status, body)
    status = status_of(reply.kind)
    idempotency.keep(tx, who.id, env.id, status, reply.body, now)
    return Received(status, dict(reply.body), applied.wakes, applied.statuses)


# --------------------------------------------------------------------------- modes and webhooks


def _case_named(job: Job, key: str) -> CaseView:
    case = load_case(job.rt, job.tx, key)
    if case is None:
        raise WireError(f"case.key: no case {key}", code="unknown-case")
    return case


def _handoff_named(job: Job, case: CaseView, handoff_id: str) -> HandoffView:
    handoff = named_handoff(job.rt, job.tx, case, handoff_id)
    if handoff is None or handoff.case_key != case.key:
        raise WireError(
            f"handoff_id: no handoff {handoff_id} on case {case.key}", code="unknown-handoff"
        )
    return handoff


def _handoff_status(job: Job, who: Principal, env: Envelope, msg: HandoffStatus) -> Handled:
    # One statement reads the case and its open handoff, which is usually the
    # one the status is about; docs/protocol.md §9 order: unknown case, then handoff.
    rt = job.rt
    case = _case_named(job, msg.case.key)
    handoff = _handoff_named(job, case, msg.handoff_id)
    authorize_status(who, handoff)
    if case.role == "master":
        reply = status_from_mode(case, handoff, msg, resume=True)
    else:
        # docs/protocol.md §13.4: email "relays every handoff.status to the master,
        # and does the negotiation ... only when autonomous_send is true".
        policy = policy_of(rt, job.tx, case)
        reply = status_from_mode(
            case,
            handoff,
            msg,
            resume=False,
            ask=policy.autonomous_send,
            relay=rt.master_of(case.domain, case.type),
        )
    return reply, apply(job, case, reply.effects, quiet=True)


# --------------------------------------------------------------------------- the master's messages


def _check_webhook(
    rt: Runtime, domain: str, type_: str, patch: PolicyPatch | None, field: str
) -> None:
    """docs/protocol.md §18: a transfers URL outside the configured webhooks is
    ``invalid-message``.
    """
    if patch is None or patch.transfers in (None, "block"):
        return
    typ = rt.config.type_for(domain, type_)
    if typ is None or webhook_for(typ, patch.transfers or "") is None:
        raise WireError(
            f"{field}: {patch.transfers!r} is not under a configured webhooks url "
            f"of {type_}@{domain}",
            code="invalid-message",
        )


def _master_case(job: Job, who: Principal, env: Envelope, key: str) -> CaseView:
    """The case a master's message names, once the master may act on it; the
    message goes on its thread."""
    case = _case_named(job, key)
    authorize_master(who, case)
    _received(job, case, env)
    return case


def _received(job: Job, case: CaseView, env: Envelope, **more: Any) -> None:
    """The ``contract.in`` entry of a message on ``case``'s thread."""
    entry = {"type": env.type, "id": env.id, **more}
    append_thread(job.tx, case.key, "contract.in", entry, at=job.now)


def _case_policy(job: Job, who: Principal, env: Envelope, msg: CasePolicy) -> Handled:
    type_, domain = msg.case.key.partition("=")[0], msg.case.key.rpartition("@")[2]
    _check_webhook(job.rt, domain, type_, msg.policy, "transfers.webhook")
    case = _master_case(job, who, env, msg.case.key)
    policy = patched(policy_of(job.rt, job.tx, case), msg.policy)
    return Reply("ok", OK), apply(job, case, [SetPolicy(policy)])


def _mail_send(job: Job, who: Principal, env: Envelope, msg: MailSend) -> Handled:
    """docs/protocol.md §13.3: a reply to a recorded message of the case, to its sender."""
    case = _master_case(job, who, env, msg.case.key)
    send = SendMail(
        "reply", msg.body, subject=msg.subject, reply_to=msg.in_reply_to, auto_submitted=False
    )
    applied = apply(job, case, [send])
    refusal = applied.refusals[0]
    if refusal is not None:
        body = {
            "ok": False,
            "error": "refused",
            "reason": refusal,
            "detail": f"in_reply_to {msg.in_reply_to}: {refusal}",
        }
        return Reply("refused", body), applied
    return Reply("ok", {"ok": True, "sent": True}), applied


def _handoff_cancel(job: Job, who: Principal, env: Envelope, msg: HandoffCancel) -> Handled:
    """docs/protocol.md §13.5: the master ends a handoff; docs/protocol.md §13.4 for a
    request that was never forwarded (it has no handoff, only its report)."""
    case = _case_named(job, msg.case.key)
    authorize_master(who, case)
    handoff = named_handoff(job.rt, job.tx, case, msg.handoff_id)
    if handoff is not None and handoff.case_key != case.key:
        handoff = None
    reported = handoff is None and thread.reported_request(job.tx, case.key, msg.handoff_id)
    reply = cancel_from_master(case, handoff, msg, job.context(), reported=reported)
    # The entry names the handoff, and says when the cancel ended nothing.
    ignored = {"ignored": reply.body["ignored"]} if "ignored" in reply.body else {}
    _received(job, case, env, handoff_id=msg.handoff_id, reason=msg.reason, **ignored)
    return reply, apply(job, case, reply.effects, quiet=True)


def _intake(job: Job, intake_ref: str) -> messages.Intake:
    found = messages.intake(job.tx, intake_ref)
    if found is None:
        raise WireError(f"intake_ref: no intake {intake_ref}", code="unknown-intake")
    return found


def _intake_mail(job: Job, found: messages.Intake) -> ParsedMail | None:
    """The intake's mail, parsed again, when it asked for a mode (else None)."""
    intake = found.view
    if not intake.requested_mode:
        return None
    return build_event(
        messages.raw(job.tx, intake.message_ref),
        mail_from=found.mail_from,
        rcpt_to=found.rcpt_to,
        received_at=intake.event.get("received_at", ""),
        message_ref=intake.message_ref,
        trust=job.rt.trust(),
    )


def _case_assign(job: Job, who: Principal, env: Envelope, msg: CaseAssign) -> Handled:
    """docs/protocol.md §13.1: the master names the case; email adopts ``TYPE=ID@D``."""
    rt = job.rt
    found = _intake(job, msg.intake_ref)
    intake = found.view
    domain, type_ = intake.domain, intake.type
    # docs/protocol.md §9: "400 invalid-message (schema, bounds ...)" before "403
    # forbidden (right peer type, not its case ...)"; the id's bound depends
    # on the intake's type, so both follow the lookup.
    try:
        resource_id = check_id(msg.resource_id, type=type_)
    except MasdError as exc:
        raise WireError(f"resource_id: {exc.detail}", code="invalid-message") from exc
    _check_webhook(rt, domain, type_, msg.policy, "policy.transfers.webhook")
    authorize_assign(who, msg.intake_ref, domain, type_)
    address = parse_address(f"{type_}={resource_id}@{domain}", delimiter="")
    # docs/protocol.md §2: the canonical address has the "id as assigned"; an id with
    # the same key names the same case, which keeps its first spelling.
    ref = {"address": cases.address(job.tx, address.key) or address.canonical, "key": address.key}
    again = assigned_before(intake, address.key, ref)
    if again is not None:
        return again, NOTHING
    existing = load_case(rt, job.tx, address.key)
    case = existing or assigned_case(address, resource_id, intake)
    base = rt.default_policy(domain, type_) if existing is None else policy_of(rt, job.tx, case)
    terms = rt.slave_terms(domain, type_, patched(base, msg.policy))
    mail = _intake_mail(job, found)
    effects = case_assigned(
        case, intake, msg, terms, job.context(), opened=existing is None, mail=mail
    )
    applied = apply(job, case, effects, quiet=True)
    log.info(
        "intake assigned intake_ref=%s key=%s", msg.intake_ref, case.key, extra={"case": case.key}
    )
    return Reply("ok", {"ok": True, "case": ref}), applied


Handler = Callable[[Job, Principal, Envelope, Any], Handled]

#: Each message type email receives, and what handles it (docs/protocol.md §9
#: ``MAY_SEND`` says which peers may send which; the edge checked that).
HANDLERS: Final[Mapping[str, Handler]] = {
    "handoff.status": _handoff_status,
    "case.assign": _case_assign,
    "case.policy": _case_policy,
    "mail.send": _mail_send,
    "handoff.cancel": _handoff_cancel,
}
