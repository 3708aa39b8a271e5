"""The pure role engine: decisions as effects, no I/O (docs/protocol.md §11, §3-§6, §9-§10, §12)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from masd.core.address import parse_address
from masd.core.engine import (
    AbandonRequest,
    CaseView,
    Context,
    CreateCase,
    EndpointView,
    HandoffView,
    OpenHandoff,
    SendContract,
    SendMail,
    Status,
    Thread,
    TypeView,
    authorize_assign,
    authorize_master,
    authorize_status,
    master_deadline,
    master_mail,
    request_failed,
    status_from_mode,
)
from masd.core.errors import TransitionError, WireError
from masd.core.event import ParsedMail, build_event
from masd.core.trust import TrustSettings
from masd.core.wire import CaseRef, HandoffStatus
from masd.service.peer_directory import Peer, PeerKind, Principal

TRUST = TrustSettings(frozenset({"mx.help.example"}), frozenset({"mx.help.example"}))
ENDPOINT = EndpointView(
    "mode:help.example/ticket/callback", "http://127.0.0.1:9/mas", 7200.0, ("phone", "time")
)
TYPE = TypeView(
    role="master",
    modes=frozenset({"callback", "chat", "video"}),
    endpoints=MappingProxyType({"callback": ENDPOINT}),
    acknowledge=True,
    require_dmarc_for_handoff=True,
    id_prefix="gs-",
)


def mail(
    rcpt: str,
    *,
    sender: str = "alice@example.com",
    dmarc: str | None = "pass",
    body: str = "Please call me.\nphone: +1 555 0100\n",
    extra: str = "",
    mail_from: str | None = None,
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
        mail_from=sender if mail_from is None else mail_from,
        rcpt_to=rcpt,
        received_at="2026-11-29T10:00:00Z",
        message_ref="msg-1",
        trust=TRUST,
    )


def ctx(now: float = 1000.0) -> Context:
    counter = itertools.count(1)
    return Context(
        now=now, new_id=lambda: f"id{next(counter)}", status_url="http://masd/mas/v0.1/messages"
    )


def case(handoff: HandoffView | None = None) -> CaseView:
    return CaseView(
        "ticket=gs-1@help.example",
        "ticket=gs-1@help.example",
        "help.example",
        "ticket",
        "gs-1",
        "master",
        "alice@example.com",
        handoff,
    )


def handoff(
    status: str = "requested", last_seq: int | None = None, needs: tuple[str, ...] = ()
) -> HandoffView:
    return HandoffView(
        "h1",
        "ticket=gs-1@help.example",
        "callback",
        ENDPOINT.peer,
        ENDPOINT.url,
        status,
        last_seq,
        needs,
    )


def of(kind: type, effects: list) -> list:  # type: ignore[type-arg]
    return [e for e in effects if isinstance(e, kind)]


def test_intake_opens_a_case_and_acknowledges() -> None:
    effects = master_mail(
        None,
        parse_address("ticket@help.example"),
        mail("ticket@help.example"),
        TYPE,
        ctx(),
        new_case_id="gs-1",
    )
    (created,) = of(CreateCase, effects)
    assert created.case.address == "ticket=gs-1@help.example"
    assert created.case.participant == "alice@example.com"
    assert [t.kind for t in of(Thread, effects)] == ["mail.in"]
    (ack,) = of(SendMail, effects)
    assert ack.purpose == "acknowledge"
    assert ack.auto_submitted
    assert "ticket=gs-1@help.example" in ack.body
    assert not of(SendContract, effects)


def test_no_acknowledgement_when_the_type_says_so() -> None:
    typ = TypeView(**{**TYPE.__dict__, "acknowledge": False})
    effects = master_mail(
        None,
        parse_address("ticket@help.example"),
        mail("ticket@help.example"),
        typ,
        ctx(),
        new_case_id="gs-1",
    )
    assert not of(SendMail, effects)


def test_callback_intake_requests_a_handoff_with_details() -> None:
    effects = master_mail(
        None,
        parse_address("ticket!callback@help.example"),
        mail("ticket!callback@help.example"),
        TYPE,
        ctx(),
        new_case_id="gs-1",
    )
    (opened,) = of(OpenHandoff, effects)
    assert opened.deadline_at == 1000.0 + 7200.0
    assert [s.status for s in of(Status, effects)] == ["requested"]
    (send,) = of(SendContract, effects)
    msg = send.message
    assert msg["type"] == "handoff.request"
    assert msg["case"] == {"address": "ticket=gs-1@help.example", "key": "ticket=gs-1@help.example"}
    assert msg["details"] == {"subject": "Help", "phone": "+1 555 0100"}
    assert msg["status_url"] == "http://masd/mas/v0.1/messages"
    assert msg["participant"] == {"address": "alice@example.com"}
    assert msg["handoff_id"] == opened.handoff_id
    (ack,) = of(SendMail, effects)
    assert ack.purpose == "acknowledge"


@pytest.mark.parametrize(
    ("rcpt", "kwargs", "reason"),
    [
        ("ticket!chat@help.example", {}, "mode-unavailable"),
        ("ticket!fax@help.example", {}, "mode-not-enabled"),
        ("ticket!callback@help.example", {"dmarc": "fail"}, "blocked"),
        ("ticket!callback@help.example", {"dmarc": None}, "blocked"),
        ("ticket!callback@help.example", {"extra": "Auto-Submitted: auto-replied\r\n"}, "blocked"),
    ],
)
def test_refused_on_the_spot_is_one_mail(rcpt: str, kwargs: dict, reason: str) -> None:  # type: ignore[type-arg]
    effects = master_mail(
        None, parse_address(rcpt), mail(rcpt, **kwargs), TYPE, ctx(), new_case_id="gs-1"
    )
    statuses = of(Status, effects)
    assert [(s.status, s.source) for s in statuses] == [
        ("requested", "email"),
        ("refused", "email"),
    ]
    assert statuses[1].fields == {"reason": reason}
    assert not of(SendContract, effects)
    (only,) = of(
        SendMail, effects
    )  # docs/protocol.md §5: acknowledgement and resume notice are one mail
    assert only.purpose == "acknowledge"
    assert "refused" in only.body


def test_callback_on_an_existing_case_from_someone_else_is_blocked() -> None:
    rcpt = "ticket=gs-1!callback@help.example"
    effects = master_mail(
        case(),
        parse_address(rcpt),
        mail(rcpt, sender="mallory@example.net"),
        TYPE,
        ctx(),
        new_case_id="",
    )
    assert [s.fields.get("reason") for s in of(Status, effects)] == [None, "blocked"]
    (notice,) = of(SendMail, effects)
    assert notice.purpose == "resume"


def test_one_open_handoff_per_case() -> None:
    rcpt = "ticket=gs-1!callback@help.example"
    effects = master_mail(
        case(handoff("scheduled", 2)), parse_address(rcpt), mail(rcpt), TYPE, ctx(), new_case_id=""
    )
    assert [type(e) for e in effects] == [Thread]
    assert effects[0].data["requested_mode"] == "callback"


def test_negotiation_reply_from_the_participant_becomes_an_update() -> None:
    rcpt = "ticket=gs-1@help.example"
    open_ = handoff("negotiating", 3, ("phone",))
    effects = master_mail(
        case(open_),
        parse_address(rcpt),
        mail(rcpt, body="> phone:\nphone: 555 0199\n"),
        TYPE,
        ctx(),
        new_case_id="",
    )
    (send,) = of(SendContract, effects)
    assert send.message["type"] == "handoff.update"
    assert send.message["details"] == {"phone": "555 0199"}


@pytest.mark.parametrize(
    "kwargs", [{"sender": "mallory@example.net"}, {"dmarc": "fail"}, {"body": "no details here"}]
)
def test_negotiation_reply_that_may_not_steer_sends_nothing(kwargs: dict) -> None:  # type: ignore[type-arg]
    rcpt = "ticket=gs-1@help.example"
    effects = master_mail(
        case(handoff("negotiating", 3, ("phone",))),
        parse_address(rcpt),
        mail(rcpt, **kwargs),
        TYPE,
        ctx(),
        new_case_id="",
    )
    assert not of(SendContract, effects)


def status(seq: int, value: str, **fields: object) -> HandoffStatus:
    return HandoffStatus(
        "s1",
        CaseRef("ticket=gs-1@help.example", "ticket=gs-1@help.example"),
        "h1",
        seq,
        value,
        **fields,
    )  # type: ignore[arg-type]


def test_stale_seq_is_ignored_before_the_table_is_consulted() -> None:
    reply = status_from_mode(case(), handoff("running", 5), status(5, "requested"), resume=True)
    assert (reply.kind, dict(reply.body), list(reply.effects)) == (
        "ok",
        {"ok": True, "ignored": "stale"},
        [],
    )


def test_terminal_status_mails_the_participant() -> None:
    reply = status_from_mode(case(), handoff("running", 2), status(3, "completed"), resume=True)
    assert [type(e) for e in reply.effects] == [Status, SendMail]
    assert reply.effects[1].purpose == "resume"


def test_negotiating_mails_the_question() -> None:
    reply = status_from_mode(
        case(), handoff("requested"), status(1, "negotiating", needs=("phone", "time")), resume=True
    )
    (question,) = of(SendMail, list(reply.effects))
    assert "phone:\ntime:\n" in question.body


def test_a_mode_may_not_send_timed_out() -> None:
    with pytest.raises(TransitionError):
        status_from_mode(case(), handoff("running", 2), status(3, "timed-out"), resume=True)


def test_nothing_after_a_terminal_status() -> None:
    with pytest.raises(TransitionError, match="terminal"):
        status_from_mode(case(), handoff("completed", 2), status(3, "running"), resume=True)


def test_deadline_times_out_cancels_and_resumes() -> None:
    effects = master_deadline(case(), handoff("scheduled", 1), ctx())
    assert [type(e) for e in effects] == [Status, AbandonRequest, SendContract, SendMail]
    assert effects[0].status == "timed-out"
    assert effects[2].message["type"] == "handoff.cancel"
    assert effects[2].message["reason"] == "timed-out"
    assert master_deadline(case(), handoff("completed", 1), ctx()) == []


def test_refused_request_records_failed_and_resumes() -> None:
    effects = request_failed(case(), handoff("requested"), "HTTP 400: bad")
    assert [(type(e), getattr(e, "status", None)) for e in effects] == [
        (Status, "failed"),
        (SendMail, None),
    ]
    assert request_failed(case(), handoff("failed"), "x") == []


# --------------------------------------------------------------------------- who may act


def principal(kind: PeerKind, domain: str, type_: str, peer_id: str) -> Principal:
    peer = Peer(peer_id, kind, domain, type_, "http://127.0.0.1:9/", "secret")
    return Principal(kind, (peer,))


CALLBACK = principal("mode", "help.example", "ticket", ENDPOINT.peer)
CHAT = principal("mode", "help.example", "ticket", "mode:help.example/ticket/chat")
CRM = principal("master", "help.example", "case", "master:help.example/case")
OTHER_CRM = principal("master", "other.example", "case", "master:other.example/case")


def forbidden(call: Any) -> str:
    with pytest.raises(WireError) as caught:
        call()
    assert caught.value.code == "forbidden"
    return caught.value.detail


def test_a_status_only_from_the_peer_the_handoff_was_sent_to() -> None:
    authorize_status(CALLBACK, handoff())
    assert "h1" in forbidden(lambda: authorize_status(CHAT, handoff()))
    # A handoff email answered itself was sent to no peer: nobody may post to it.
    refused = replace(handoff("refused"), peer="email")
    forbidden(lambda: authorize_status(CALLBACK, refused))


def test_a_master_acts_only_on_slave_cases_of_its_own_types() -> None:
    slave_case = CaseView(
        "case=crm-1@help.example",
        "case=CRM-1@help.example",
        "help.example",
        "case",
        "CRM-1",
        "slave",
        "alice@example.com",
    )
    authorize_master(CRM, slave_case)
    assert "case=crm-1@help.example" in forbidden(lambda: authorize_master(OTHER_CRM, slave_case))
    # Email's own cases are nobody's to steer, whoever serves their type.
    owner = principal("master", "help.example", "ticket", "master:help.example/ticket")
    forbidden(lambda: authorize_master(owner, case()))


def test_an_intake_is_assigned_only_by_the_master_of_its_type() -> None:
    authorize_assign(CRM, "intake-1", "help.example", "case")
    detail = forbidden(lambda: authorize_assign(OTHER_CRM, "intake-1", "help.example", "case"))
    assert "intake-1" in detail
    forbidden(lambda: authorize_assign(CALLBACK, "intake-1", "help.example", "case"))
