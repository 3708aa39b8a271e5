"""Principle 10 (docs/protocol.md §4.4) and the send caps (docs/protocol.md §4); outbound mail
(docs/protocol.md §5)."""

from __future__ import annotations

import email
import email.message
import email.policy

import pytest

from masd.core.compose import OutboundMail, render, reply_subject
from masd.core.details import find_fields, question_lines
from masd.core.principle10 import Caps, Counts, Recipient, decide_send

OK = Recipient("alice@example.com", authenticated=True, automated=False)


@pytest.mark.parametrize(
    ("recipient", "counts", "expected"),
    [
        (OK, Counts(0, 0), None),
        (None, Counts(0, 0), "unknown-message"),
        (Recipient("", authenticated=True, automated=False), Counts(0, 0), "automated-sender"),
        (
            Recipient("bot@example.com", authenticated=True, automated=True),
            Counts(0, 0),
            "automated-sender",
        ),
        (
            Recipient("eve@example.com", authenticated=False, automated=False),
            Counts(0, 0),
            "unauthenticated-sender",
        ),
        (OK, Counts(19, 0), None),
        (OK, Counts(20, 0), "send-cap-reached"),
        (OK, Counts(0, 9), None),
        (OK, Counts(0, 10), "send-cap-reached"),
        # Who the recipient is comes before the caps.
        (
            Recipient("eve@example.com", authenticated=False, automated=False),
            Counts(99, 99),
            "unauthenticated-sender",
        ),
    ],
)
def test_decide_send(recipient: Recipient | None, counts: Counts, expected: str | None) -> None:
    assert decide_send(recipient, counts, Caps(20, 10)) == expected


def test_find_fields_takes_first_unquoted_value_case_insensitively() -> None:
    text = "> Phone:\n> phone: 111\nPHONE: +1 555 0100\nphone: 222\ntime:\nfax: 1\n"
    assert find_fields(text, ["phone", "time"]) == {"phone": "+1 555 0100"}
    assert question_lines(["phone", "time"]) == "phone:\ntime:\n"


def test_rendered_mail_is_threaded_and_marked() -> None:
    raw = render(
        OutboundMail(
            sender="ticket=gs-1@help.example",
            to="alice@example.com",
            subject="Re: help\r\nBcc: victim@example.net\x00",
            body="Grüße\n",
            message_id="<abc@help.example>",
            in_reply_to="<m1@example.com>",
            references=["<m0@example.com>", "<m1@example.com>"],
            auto_submitted=True,
            date=0,
        )
    )
    assert b"\r\n" in raw
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert msg["From"] == "ticket=gs-1@help.example"
    assert msg["Subject"] == "Re: help Bcc: victim@example.net"
    assert msg["Bcc"] is None
    assert msg["In-Reply-To"] == "<m1@example.com>"
    assert msg["References"] == "<m0@example.com> <m1@example.com>"
    assert msg["Auto-Submitted"] == "auto-replied"
    assert msg.get_content().replace("\r\n", "\n") == "Grüße\n"
    assert b"Content-Transfer-Encoding: quoted-printable" in raw


def test_a_masters_mail_carries_no_auto_submitted() -> None:
    raw = render(
        OutboundMail("a=b@c.example", "x@y.example", "s", "b", "<i@c.example>", None, [], False, 0)
    )
    assert b"Auto-Submitted" not in raw
    assert b"In-Reply-To" not in raw


def test_reply_subject() -> None:
    assert reply_subject("Help") == "Re: Help"
    assert reply_subject(None) == "Re: your message"
    assert reply_subject("") == "Re: your message"


@pytest.mark.parametrize(
    ("replied_to", "subject"),
    [
        ("Re: Help", "Re: Help"),
        ("RE: Help", "Re: Help"),
        ("re: Help", "Re: Help"),
        ("Re:Help", "Re: Help"),
        ("Re: Re: Help", "Re: Help"),
        ("RE: re:  Re : Help", "Re: Help"),
        ("  Re:\tHelp", "Re: Help"),
        ("Re:", "Re: your message"),
        # Only the leading run: a forward stays, with whatever follows it.
        ("Fwd: Help", "Re: Fwd: Help"),
        ("Re: Fwd: Re: Help", "Re: Fwd: Re: Help"),
        # Words that merely begin with "re" are the subject's own.
        ("Reply needed", "Re: Reply needed"),
        ("Re-opened: Help", "Re: Re-opened: Help"),
    ],
)
def test_reply_subject_has_exactly_one_re(replied_to: str, subject: str) -> None:
    assert reply_subject(replied_to) == subject


def _parsed(**fields: object) -> email.message.EmailMessage:
    base: dict[str, object] = {
        "sender": "ticket=gs-1@help.example",
        "to": "alice@example.com",
        "subject": "Re: help",
        "body": "hello\n",
        "message_id": "<abc@help.example>",
        "in_reply_to": None,
        "references": [],
        "auto_submitted": True,
        "date": 1_790_000_000,
    }
    raw = render(OutboundMail(**{**base, **fields}))  # type: ignore[arg-type]
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    assert b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only
    return email.message_from_bytes(raw, policy=email.policy.default)  # type: ignore[return-value]


def test_long_and_non_ascii_subjects_fold_and_decode() -> None:
    subject = "Re: Grüße aus Köln, " + "ein sehr langer Betreff " * 8
    msg = _parsed(subject=subject)
    assert msg["Subject"] == subject.strip()
    long_ascii = "Re: " + "word " * 40
    assert _parsed(subject=long_ascii)["Subject"] == long_ascii.strip()


def test_bodies_are_7bit_or_quoted_printable() -> None:
    plain = _parsed(body="line one\nline two")
    assert plain["Content-Transfer-Encoding"] == "7bit"
    assert plain.get_content().replace("\r\n", "\n") == "line one\nline two\n"
    long_line = "x" * 2000
    wide = _parsed(body=long_line)
    assert wide["Content-Transfer-Encoding"] == "quoted-printable"
    assert wide.get_content().replace("\r\n", "\n") == long_line + "\n"


def test_date_is_rfc5322_with_a_numeric_zone() -> None:
    assert _parsed()["Date"] == "Mon, 21 Sep 2026 14:13:20 +0000"


def test_an_smtputf8_recipient_stays_utf8() -> None:
    assert _parsed(to="josé@exämple.com")["To"] == "josé@exämple.com"
