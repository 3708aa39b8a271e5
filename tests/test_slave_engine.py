"""The pure engine in the slave role: decisions as effects (docs/protocol.md §13, §4, §6)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from masd.core.address import parse_address
from masd.core.engine import (
    AssignIntake,
    CaseView,
    Context,
    CreateCase,
    Effect,
    HandoffView,
    OpenHandoff,
    Peer,
    PolicyView,
    SendContract,
    SendMail,
    SetPolicy,
    Status,
    Thread,
    status_from_mode,
)
from masd.core.errors import TransitionError, WireError
from masd.core.event import ParsedMail, build_event
from masd.core.slave import (
    IntakeView,
    SlaveTerms,
    Transfer,
    assigned_before,
    assigned_case,
    cancel_from_master,
    case_assigned,
    case_message,
    patched,
    slave_intake,
    slave_mail,
    slave_request,
    slave_request_failed,
)
from masd.core.trust import TrustSettings
from masd.core.wire import CaseAssign, CaseRef, HandoffCancel, HandoffStatus, PolicyPatch

TRUST = TrustSettings(frozenset({"mx.help.example"}), frozenset({"mx.help.example"}))
MASTER = Peer("master:help.example/case", "http://127.0.0.1:9/crm")
HOOK = Transfer(
    "webhook:help.example/case/http://127.0.0.1:9/hooks/", "http://127.0.0.1:9/hooks/a", ("phone",)
)
BLOCK = PolicyView(autonomous_send=False, transfers="block")
FORWARD = PolicyView(autonomous_send=False, transfers=HOOK.url)
AUTONOMOUS = PolicyView(autonomous_send=True, transfers=HOOK.url)
ADDRESS = "case=CRM-1@help.example"
KEY = "case=crm-1@help.example"


def mail(
    rcpt: str = ADDRESS,
    *,
    sender: str = "alice@example.com",
    dmarc: str | None = "pass",
    body: str = "Please call me.\nphone: +1 555 0100\n",
    extra: str = "",
) -> ParsedMail:
    ar = (
        f"Authentication-Results: mx.help.example; dmarc={dmarc}"
        f" header.from={sender.split('@')[1]}\r\n"
        if dmarc
        else ""
    )
    raw = (
        f"{ar}From: {sender}\r\nTo: {rcpt}\r\nSubject: Help\r\n"
        f"Message-ID: <m1@example.com>\r\n{extra}\r\n{body}"
    ).encode()
    return build_event(
        raw,
        mail_from=sender,
        rcpt_to=rcpt,
        received_at="2026-11-29T10:00:00Z",
        message_ref="msg-1",
        trust=TRUST,
    )


def ctx() -> Context:
    counter = itertools.count(1)
    return Context(
        now=1000.0, new_id=lambda: f"id{next(counter)}", status_url="http://masd/mas/v0.1/messages"
    )


def handoff(
    status: str = "requested",
    last_seq: int | None = None,
    needs: tuple[str, ...] = (),
    *,
    forwarded: bool = True,
) -> HandoffView:
    return HandoffView(
        "h1",
        KEY,
        "callback",
        HOOK.peer if forwarded else "email",
        HOOK.url if forwarded else None,
        status,
        last_seq,
        needs,
        forwarded,
    )


def case(open_handoff: HandoffView | None = None) -> CaseView:
    return CaseView(
        KEY, ADDRESS, "help.example", "case", "CRM-1", "slave", "alice@example.com", open_handoff
    )


def of(kind: type, effects: Any) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def to_master(effects: Any) -> list[dict[str, Any]]:
    return [dict(e.message) for e in of(SendContract, effects) if e.peer == MASTER.peer]


def terms(
    policy: PolicyView, transfer: Transfer | None = HOOK, *, require_dmarc: bool = True
) -> SlaveTerms:
    """The case's terms: no transfer under block."""
    hook = transfer if policy.transfers != "block" else None
    return SlaveTerms(policy, MASTER, hook, require_dmarc)


def on_mail(
    rcpt: str, parsed: ParsedMail, policy: PolicyView, c: CaseView | None = None
) -> list[Effect]:
    return slave_mail(c or case(), parse_address(rcpt), parsed, terms(policy), ctx())


def status(seq: int, value: str, **fields: Any) -> HandoffStatus:
    return HandoffStatus("s1", CaseRef(ADDRESS, KEY), "h1", seq, value, **fields)


# --------------------------------------------------------------------------- values


def test_policy_to_json_is_the_contract_shape() -> None:
    assert BLOCK.to_json() == {"autonomous_send": False, "transfers": "block"}
    assert AUTONOMOUS.to_json() == {"autonomous_send": True, "transfers": {"webhook": HOOK.url}}


def test_case_message_carries_event_and_message_ref() -> None:
    event = {"message_ref": "msg-9", "subject": "Hi"}
    message = case_message(case(), "msg-9", event)
    assert message == {
        "mas_modes_version": "0.1",
        "type": "case.message",
        "id": "msg-msg-9",  # one message recorded once is reported once
        "case": {"address": ADDRESS, "key": KEY},
        "event": event,
        "message_ref": "msg-9",
    }


# --------------------------------------------------------------------------- mail on a case


def test_mail_is_recorded_and_reported_and_nothing_else() -> None:
    parsed = mail()
    effects = on_mail(ADDRESS, parsed, AUTONOMOUS)
    (entry,) = of(Thread, effects)
    assert entry.kind == "mail.in"
    assert entry.data["message_ref"] == "msg-1"
    assert "requested_mode" not in entry.data
    (message,) = to_master(effects)
    assert message["type"] == "case.message"
    assert message["event"] == parsed.event.to_json()
    # docs/protocol.md §13.3: no mail unless the master asks (a plain mail is not a question).
    assert of(SendMail, effects) == []
    assert len(effects) == 2


def test_block_reports_not_forwarded_and_nothing_else() -> None:
    effects = on_mail("case=CRM-1!callback@help.example", mail(), BLOCK)
    assert of(Thread, effects)[0].data["requested_mode"] == "callback"
    case_msg, requested = to_master(effects)
    assert case_msg["type"] == "case.message"
    assert requested["type"] == "handoff.requested"
    assert (requested["mode"], requested["forwarded"]) == ("callback", False)
    assert requested["handoff_id"] == "id1"
    assert "reason" not in requested
    assert of(OpenHandoff, effects) == []
    assert of(Status, effects) == []
    assert of(SendMail, effects) == []


def test_webhook_gets_the_request_and_the_master_is_told() -> None:
    effects = on_mail("case=CRM-1!callback@help.example", mail(), FORWARD)
    (opened,) = of(OpenHandoff, effects)
    assert opened.deadline_at is None  # docs/protocol.md §13.5: timeouts belong to the master
    assert (opened.peer, opened.url, opened.forwarded) == (HOOK.peer, HOOK.url, True)
    assert opened.details == {"subject": "Help", "phone": "+1 555 0100"}
    (requested_status,) = of(Status, effects)
    assert (requested_status.status, requested_status.source) == ("requested", "email")
    (request,) = [e for e in of(SendContract, effects) if e.peer == HOOK.peer]
    assert request.url == HOOK.url
    assert request.message["type"] == "handoff.request"
    assert request.message["handoff_id"] == opened.handoff_id
    assert request.message["status_url"] == "http://masd/mas/v0.1/messages"
    assert request.message["participant"] == {"address": "alice@example.com"}
    _, requested = to_master(effects)
    assert requested["forwarded"] is True
    assert requested["handoff_id"] == opened.handoff_id
    assert requested["id"] == f"req-{opened.handoff_id}"


def test_any_mode_goes_to_the_master_modes_do_not_apply() -> None:
    # docs/protocol.md §13: "The type's modes list does not apply to slave types".
    effects = on_mail("case=CRM-1!carrier-pigeon@help.example", mail(), FORWARD)
    (opened,) = of(OpenHandoff, effects)
    assert opened.mode == "carrier-pigeon"


@pytest.mark.parametrize(
    ("sender", "dmarc", "extra"),
    [
        ("alice@example.com", None, ""),  # not authenticated
        ("alice@example.com", "fail", ""),
        ("alice@example.com", "pass", "Auto-Submitted: auto-generated\r\n"),
        ("mallory@example.net", "pass", ""),  # not the participant
    ],
)
def test_steering_needs_the_authenticated_participant(
    sender: str, dmarc: str | None, extra: str
) -> None:
    effects = on_mail(
        "case=CRM-1!callback@help.example",
        mail(sender=sender, dmarc=dmarc, extra=extra),
        FORWARD,
    )
    (opened,) = of(OpenHandoff, effects)
    assert (opened.peer, opened.url, opened.forwarded) == ("email", None, False)
    assert [(s.status, s.source, dict(s.fields)) for s in of(Status, effects)] == [
        ("requested", "email", {}),
        ("refused", "email", {"reason": "blocked"}),
    ]
    _, requested = to_master(effects)
    assert (requested["forwarded"], requested["reason"]) == (False, "blocked")
    assert [e for e in of(SendContract, effects) if e.peer == HOOK.peer] == []


def test_steering_without_require_dmarc() -> None:
    effects = slave_request(
        case(), "callback", mail(dmarc=None), terms(FORWARD, require_dmarc=False), ctx()
    )
    (opened,) = of(OpenHandoff, effects)
    assert opened.forwarded is True


def test_one_open_handoff_per_case() -> None:
    c = case(handoff("scheduled", 1))
    effects = on_mail("case=CRM-1!callback@help.example", mail(), FORWARD, c)
    assert of(OpenHandoff, effects) == []
    assert [m["type"] for m in to_master(effects)] == ["case.message"]


def test_a_policy_without_a_matching_webhook_does_not_forward() -> None:
    effects = slave_request(case(), "callback", mail(), terms(FORWARD, None), ctx())
    (requested,) = to_master(effects)
    assert requested["forwarded"] is False
    assert of(OpenHandoff, effects) == []


def test_negotiation_reply_is_an_update_only_with_autonomous_send() -> None:
    c = case(handoff("negotiating", 1, ("phone",)))
    reply = mail(body="phone: +1 555 0199\n")
    quiet = on_mail(ADDRESS, reply, FORWARD, c)
    # docs/protocol.md §6: "In the slave role without autonomous_send, email asks
    # nothing and sends no handoff.update; the master sees the reply as case.message."
    assert [e for e in of(SendContract, quiet) if e.peer == HOOK.peer] == []
    assert [m["type"] for m in to_master(quiet)] == ["case.message"]

    loud = on_mail(ADDRESS, reply, AUTONOMOUS, c)
    (update,) = [e for e in of(SendContract, loud) if e.peer == HOOK.peer]
    assert update.url == HOOK.url
    assert update.message["type"] == "handoff.update"
    assert update.message["details"] == {"phone": "+1 555 0199"}
    assert [m["type"] for m in to_master(loud)] == ["case.message"]

    # Someone else's reply supplies nothing, autonomous or not.
    other = on_mail(ADDRESS, mail(sender="bob@example.net", body="phone: 1\n"), AUTONOMOUS, c)
    assert [e for e in of(SendContract, other) if e.peer == HOOK.peer] == []


# --------------------------------------------------------------------------- statuses and relays


def test_every_status_is_relayed_with_the_modes_seq() -> None:
    h = handoff("requested")
    reply = status_from_mode(
        case(h), h, status(1, "scheduled", at="2030-01-01T10:00:00Z"), resume=False, relay=MASTER
    )
    assert (reply.kind, dict(reply.body)) == ("ok", {"ok": True})
    (recorded,) = of(Status, reply.effects)
    assert (recorded.status, recorded.seq, recorded.source) == ("scheduled", 1, "mode")
    (relayed,) = of(SendContract, reply.effects)
    assert (relayed.peer, relayed.url, relayed.handoff_id) == (MASTER.peer, MASTER.url, "h1")
    assert relayed.message == {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": "relay-h1-1",
        "case": {"address": ADDRESS, "key": KEY},
        "handoff_id": "h1",
        "seq": 1,
        "status": "scheduled",
        "at": "2030-01-01T10:00:00Z",
    }


def test_terminal_status_is_relayed_and_nobody_is_mailed() -> None:
    h = handoff("running", 2)
    reply = status_from_mode(
        case(h), h, status(3, "completed", detail="done"), resume=False, relay=MASTER
    )
    assert of(SendMail, reply.effects) == []
    (relayed,) = of(SendContract, reply.effects)
    assert (relayed.message["status"], relayed.message["detail"]) == ("completed", "done")


@pytest.mark.parametrize(("ask", "questions"), [(False, 0), (True, 1)])
def test_question_only_with_autonomous_send(ask: bool, questions: int) -> None:
    h = handoff("requested")
    reply = status_from_mode(
        case(h), h, status(1, "negotiating", needs=("phone",)), resume=False, ask=ask, relay=MASTER
    )
    mails = of(SendMail, reply.effects)
    assert len(mails) == questions
    if mails:
        assert mails[0].purpose == "question"
        assert mails[0].auto_submitted is True
        assert "phone:" in mails[0].body.splitlines()
    (relayed,) = of(SendContract, reply.effects)
    assert relayed.message["needs"] == ["phone"]


def test_stale_and_timed_out_statuses_are_not_relayed() -> None:
    h = handoff("scheduled", 2)
    stale = status_from_mode(case(h), h, status(2, "running"), resume=False, relay=MASTER)
    assert (stale.kind, dict(stale.body), list(stale.effects)) == (
        "ok",
        {"ok": True, "ignored": "stale"},
        [],
    )
    # docs/protocol.md §13.5: "Email sets no deadline and never records timed-out."
    with pytest.raises(TransitionError):
        status_from_mode(case(h), h, status(3, "timed-out"), resume=False, relay=MASTER)
    done = handoff("completed", 3)
    with pytest.raises(TransitionError):
        status_from_mode(case(done), done, status(4, "running"), resume=False, relay=MASTER)


# --------------------------------------------------------------------------- cancel and failure


def test_master_cancel_records_and_forwards() -> None:
    h = handoff("scheduled", 1)
    cancel = HandoffCancel("c1", CaseRef(ADDRESS, KEY), "h1", "solved")
    reply = cancel_from_master(case(h), h, cancel, ctx())
    assert (reply.kind, dict(reply.body)) == ("ok", {"ok": True})
    (recorded,) = of(Status, reply.effects)
    assert (recorded.status, recorded.source, dict(recorded.fields)) == (
        "cancelled",
        "email",
        {"reason": "solved"},
    )
    (forwarded,) = of(SendContract, reply.effects)
    assert (forwarded.peer, forwarded.url) == (HOOK.peer, HOOK.url)
    assert forwarded.message["type"] == "handoff.cancel"
    assert forwarded.message["reason"] == "solved"


def test_cancel_of_a_terminal_handoff_is_409() -> None:
    h = handoff("refused", None, forwarded=False)
    cancel = HandoffCancel("c1", CaseRef(ADDRESS, KEY), "h1", "solved")
    with pytest.raises(WireError) as caught:
        cancel_from_master(case(), h, cancel, ctx())
    assert caught.value.code == "invalid-transition"
    assert "h1" in caught.value.detail


def test_cancel_of_a_request_never_forwarded_is_ignored() -> None:
    # Under block the request opened no handoff; its id was reported to the master.
    effects = on_mail("case=CRM-1!callback@help.example", mail(), BLOCK)
    (requested,) = [m for m in to_master(effects) if m["type"] == "handoff.requested"]
    cancel = HandoffCancel("c1", CaseRef(ADDRESS, KEY), requested["handoff_id"], "solved")
    reply = cancel_from_master(case(), None, cancel, ctx(), reported=True)
    assert (reply.kind, dict(reply.body)) == ("ok", {"ok": True, "ignored": "not-forwarded"})
    assert list(reply.effects) == []  # no status to record, nobody to tell


def test_cancel_of_an_id_the_case_never_had_is_404() -> None:
    cancel = HandoffCancel("c1", CaseRef(ADDRESS, KEY), "h-unknown", "solved")
    with pytest.raises(WireError) as caught:
        cancel_from_master(case(), None, cancel, ctx(), reported=False)
    assert caught.value.code == "unknown-handoff"
    assert "handoff_id" in caught.value.detail
    assert "h-unknown" in caught.value.detail


def test_refused_request_fails_tells_the_master_and_mails_nobody() -> None:
    h = handoff("requested")
    effects = slave_request_failed(case(h), h, "HTTP 400: no", master=MASTER)
    (recorded,) = of(Status, effects)
    assert (recorded.status, recorded.source, dict(recorded.fields)) == (
        "failed",
        "email",
        {"detail": "HTTP 400: no"},
    )
    (relayed,) = to_master(effects)
    assert (relayed["type"], relayed["seq"], relayed["status"]) == ("handoff.status", 1, "failed")
    assert of(SendMail, effects) == []
    # After statuses from the mode the relay's seq follows the last one.
    later = handoff("running", 4)
    (relayed,) = to_master(slave_request_failed(case(later), later, "gave up", master=MASTER))
    assert relayed["seq"] == 5
    # Closed, or where the table lets nothing fail (the webhook has the handoff): nothing.
    for current in ("completed", "scheduled", "negotiating"):
        h = handoff(current, 5)
        assert slave_request_failed(case(h), h, "x", master=MASTER) == []


# --------------------------------------------------------------------------- intake and assignment


def test_intake_mail_opens_an_intake_reported_to_the_master_and_nothing_else() -> None:
    parsed = mail("case!callback@help.example")
    opened = slave_intake(parse_address("case!callback@help.example"), parsed, ctx(), master=MASTER)
    # "Email MUST NOT invent case identifiers in this role": no case, no mail.
    assert (opened.intake_ref, opened.message_ref) == ("intake-id1", "msg-1")
    assert (opened.domain, opened.type, opened.requested_mode) == (
        "help.example",
        "case",
        "callback",
    )
    assert opened.master == MASTER
    message = dict(opened.message)
    assert (message["type"], message["id"], message["intake_ref"]) == (
        "case.intake",
        "intake-msg-1",
        "intake-id1",
    )
    assert message["resource_type"] == "case"
    assert message["event"]["message_ref"] == "msg-1"
    assert "case" not in message


def test_intake_carries_requested_mode_null_when_none() -> None:
    opened = slave_intake(parse_address("case@help.example"), mail(), ctx(), master=MASTER)
    assert opened.requested_mode is None
    assert "requested_mode" in opened.message
    assert opened.message["requested_mode"] is None


def intake(
    mode: str | None = None, case_key: str | None = None, sender: str | None = "alice@example.com"
) -> IntakeView:
    event = {
        "subject": "Help",
        "auth": {"dmarc": "pass"},
        "automated": {"is": False},
        "message_ref": "msg-1",
    }
    return IntakeView("intake-1", "help.example", "case", mode, case_key, "msg-1", sender, event)


def assign(policy: PolicyPatch | None = None) -> CaseAssign:
    return CaseAssign("a1", "intake-1", "CRM-1", policy)


def on_assign(
    i: IntakeView, policy: PolicyView, *, opened: bool = True, msg: CaseAssign | None = None
) -> list[Effect]:
    c = assigned_case(parse_address(ADDRESS), "CRM-1", i)
    parsed = mail("case!callback@help.example") if i.requested_mode else None
    return case_assigned(
        c,
        i,
        msg or assign(),
        terms(policy),
        ctx(),
        opened=opened,
        mail=parsed,
    )


def test_the_assigned_case_has_the_id_as_assigned_and_the_intakes_sender() -> None:
    assert assigned_case(parse_address(ADDRESS), "CRM-1", intake()) == case()
    anonymous = assigned_case(parse_address(ADDRESS), "CRM-1", intake(sender=None))
    assert anonymous.participant == ""


def test_assign_creates_the_case_stores_its_policy_and_threads_the_intake_mail() -> None:
    effects = on_assign(intake(), BLOCK)
    assert [type(e) for e in effects] == [CreateCase, SetPolicy, AssignIntake, Thread, Thread]
    assert of(SetPolicy, effects) == [SetPolicy(BLOCK)]
    assert of(AssignIntake, effects) == [AssignIntake("intake-1", "msg-1")]
    mail_in, contract_in = of(Thread, effects)
    assert (mail_in.kind, dict(mail_in.data)) == (
        "mail.in",
        {
            "message_ref": "msg-1",
            "from": "alice@example.com",
            "subject": "Help",
            "dmarc": "pass",
            "automated": False,
            "intake_ref": "intake-1",
        },
    )
    assert (contract_in.kind, dict(contract_in.data)) == (
        "contract.in",
        {"type": "case.assign", "id": "a1"},
    )


def test_assign_acknowledges_only_with_autonomous_send() -> None:
    # docs/protocol.md §13.3: "Email sends only on mail.send from the master, unless
    # the case policy ... sets autonomous_send: true" (then acknowledgements).
    assert of(SendMail, on_assign(intake(), FORWARD)) == []
    (ack,) = of(SendMail, on_assign(intake(), AUTONOMOUS))
    assert (ack.purpose, ack.reply_to) == ("acknowledge", "msg-1")
    assert ADDRESS in ack.body


def test_assign_to_an_existing_case_sets_a_policy_only_when_the_message_has_one() -> None:
    effects = on_assign(intake(), BLOCK, opened=False)
    assert of(CreateCase, effects) == []
    assert of(SetPolicy, effects) == []
    patch = assign(PolicyPatch(autonomous_send=True))
    effects = on_assign(intake(), AUTONOMOUS, opened=False, msg=patch)
    assert of(SetPolicy, effects) == [SetPolicy(AUTONOMOUS)]


def test_assign_handles_the_requested_mode_under_the_new_policy() -> None:
    effects = on_assign(intake("callback"), FORWARD)
    assert dict(of(Thread, effects)[0].data)["requested_mode"] == "callback"
    (opened,) = of(OpenHandoff, effects)
    assert (opened.mode, opened.peer, opened.deadline_at) == ("callback", HOOK.peer, None)
    (requested,) = to_master(effects)
    assert (requested["type"], requested["forwarded"]) == ("handoff.requested", True)
    # Under block the master hears of it, and nothing is forwarded.
    (requested,) = to_master(on_assign(intake("callback"), BLOCK))
    assert requested["forwarded"] is False


def test_an_intake_assigned_before() -> None:
    ref = {"address": ADDRESS, "key": KEY}
    assert assigned_before(intake(), KEY, ref) is None
    again = assigned_before(intake(case_key=KEY), KEY, ref)
    assert again is not None
    assert (again.kind, dict(again.body), list(again.effects)) == (
        "ok",
        {"ok": True, "case": ref},
        [],
    )
    with pytest.raises(WireError) as caught:
        assigned_before(intake(case_key="case=crm-2@help.example"), KEY, ref)
    assert caught.value.code == "already-assigned"
    assert "case=crm-2@help.example" in caught.value.detail


def test_a_policy_patch_changes_only_the_fields_it_carries() -> None:
    assert patched(FORWARD, None) == FORWARD
    assert patched(FORWARD, PolicyPatch(autonomous_send=True)) == AUTONOMOUS
    assert patched(AUTONOMOUS, PolicyPatch(transfers="block")) == PolicyView(True, "block")
    assert patched(BLOCK, PolicyPatch(False, HOOK.url)) == FORWARD
