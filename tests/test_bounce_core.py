"""Bounce tags, bounce addresses, suppression decisions and reading bounces, in the core."""

from __future__ import annotations

import email
from pathlib import Path

import pytest
from flufl.bounce import all_failures
from support.bounces import postfix_dsn
from support.system import missing

from masd.core.bounce import (
    bounce_address,
    make_tag,
    own_mail_refusal,
    split_bounce,
    suppressed,
    verify_tag,
)
from masd.core.dsn import READ_BYTES, read_bounce

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
CASE = "ticket=gs-1@help.example"
FLUFL_DATA = Path("/usr/lib/python3/dist-packages/flufl/bounce/tests/data")


# --------------------------------------------------------------------------- the tag


def test_a_tag_verifies_for_its_case_and_names_its_mail() -> None:
    tag = make_tag(KEY, CASE, 42)
    assert tag.startswith("42-")
    assert tag == tag.lower()
    assert len(tag) == len("42-") + 16
    assert verify_tag(KEY, CASE, tag) == 42


def test_a_tag_survives_an_mta_that_changes_case() -> None:
    tag = make_tag(KEY, CASE, 7)
    assert verify_tag(KEY, CASE, tag.upper()) == 7
    # The case key is case-folded too: a case id written in capitals is the same case.
    assert verify_tag(KEY, "ticket=GS-1@help.example", tag) == 7


@pytest.mark.parametrize(
    "forged",
    [
        "",
        "42",
        "42-",
        "42-aaaaaaaaaaaaaaaa",  # a MAC guessed
        "43-{mac}",  # the MAC of mail 42 on mail 43
        "42-{mac}x",  # a letter more
        "42-{short}",  # a letter less
        "-{mac}",
        "x42-{mac}",
    ],
)
def test_a_forged_tag_does_not_verify(forged: str) -> None:
    mac = make_tag(KEY, CASE, 42).split("-", 1)[1]
    tag = forged.format(mac=mac, short=mac[:-1])
    assert verify_tag(KEY, CASE, tag) is None


def test_a_tag_does_not_verify_for_another_case_or_under_another_secret() -> None:
    tag = make_tag(KEY, CASE, 42)
    assert verify_tag(KEY, "ticket=gs-2@help.example", tag) is None
    assert verify_tag(KEY, "case=gs-1@help.example", tag) is None
    assert verify_tag(OTHER_KEY, CASE, tag) is None
    assert verify_tag(None, CASE, tag) is None  # no secret yet: no mail ever left


def test_tags_of_different_mails_differ() -> None:
    tags = {make_tag(KEY, CASE, n) for n in range(1, 200)}
    assert len({t.split("-", 1)[1] for t in tags}) == 199


# --------------------------------------------------------------------------- the address


def test_a_bounce_address_is_the_case_address_with_its_tag() -> None:
    tag = make_tag(KEY, CASE, 3)
    addr = bounce_address(CASE, "+", tag)
    assert addr == f"ticket=gs-1+bounce-{tag}@help.example"
    split = split_bounce(addr, "+")
    assert split is not None
    assert (split.address, split.tag) == (CASE, tag)
    assert split_bounce(f"<{addr}>", "+") == split
    # Postfix-style delimiter sets: any of them is read, the first is written.
    assert bounce_address(CASE, "-+", tag).startswith("ticket=gs-1-bounce-")
    assert split_bounce(f"ticket=gs-1+BOUNCE-{tag}@help.example", "-+") is None  # "-" first
    assert split_bounce(f"ticket=gs+BOUNCE-{tag}@help.example", "+") is not None


@pytest.mark.parametrize(
    "rcpt",
    [
        "ticket=gs-1@help.example",
        "ticket=gs-1+x@help.example",
        "ticket=gs-1+bounc@help.example",
        "+bounce-1-x@help.example",
        "no-at-sign",
    ],
)
def test_other_recipients_are_no_bounce_addresses(rcpt: str) -> None:
    assert split_bounce(rcpt, "+") is None


def test_an_empty_tag_is_still_a_bounce_address_and_verifies_nothing() -> None:
    split = split_bounce("ticket=gs-1+bounce-@help.example", "+")
    assert split is not None
    assert split.tag == ""
    assert verify_tag(KEY, CASE, split.tag) is None
    assert split_bounce("ticket=gs-1+bounce-1-x@help.example", "") is None


# --------------------------------------------------------------------------- suppression


def test_own_mails_to_a_suppressed_address_are_refused_until_it_ends() -> None:
    for purpose in ("acknowledge", "question", "resume"):
        assert own_mail_refusal(purpose, 200.0, 100.0) == "suppressed"
        assert own_mail_refusal(purpose, 200.0, 200.0) is None
        assert own_mail_refusal(purpose, None, 100.0) is None
    assert own_mail_refusal("reply", 200.0, 100.0) is None  # a master's mail.send goes
    assert suppressed(200.0, 199.9)
    assert not suppressed(200.0, 200.0)
    assert not suppressed(None, 0)


# --------------------------------------------------------------------------- reading bounces


def test_a_postfix_dsn_is_read_field_by_field() -> None:
    raw = postfix_dsn("ticket=gs-1+bounce-1-x@help.example", "bob@example.net")
    report = read_bounce(raw)
    assert report is not None
    assert report.recipient == "bob@example.net"
    assert report.status == "5.1.1"
    assert report.permanent
    assert report.remote_mta == "mx.example.net"
    assert report.diagnostic is not None
    assert "User unknown" in report.diagnostic
    assert report.diagnostic.startswith("smtp; 550 5.1.1")


def test_a_delay_is_not_permanent() -> None:
    raw = postfix_dsn(
        "a+bounce-1-x@help.example", "bob@example.net", action="delayed", status="4.4.1"
    )
    report = read_bounce(raw)
    assert report is not None
    assert report.status == "4.4.1"
    assert not report.permanent


def test_a_report_of_success_and_a_plain_mail_are_no_bounce() -> None:
    raw = postfix_dsn(
        "a+bounce-1-x@help.example", "bob@example.net", action="delivered", status="2.0.0"
    )
    assert read_bounce(raw) is None
    assert read_bounce(b"From: a@example.org\r\nSubject: hi\r\n\r\nHello.\r\n") is None
    assert read_bounce(b"\x00\xff garbage") is None


def _flufl_files() -> list[Path]:
    if not FLUFL_DATA.is_dir():
        missing("flufl.bounce's test bounces", "python3-flufl.bounce")
    return sorted(FLUFL_DATA.glob("*.txt"))


def test_real_bounces_name_the_recipients_mailmans_detectors_name() -> None:
    files = _flufl_files()
    assert len(files) > 50
    read = 0
    for path in files:
        raw = path.read_bytes()
        temporary, permanent = all_failures(email.message_from_bytes(raw))
        report = read_bounce(raw)
        if not temporary and not permanent:
            assert report is None, path.name
            continue
        read += 1
        assert report is not None, path.name
        assert report.recipient is not None, path.name
        wanted = permanent if report.permanent else temporary
        assert report.recipient.lower().encode() in {a.lower() for a in wanted}, path.name
        assert report.permanent == bool(permanent), path.name
    assert read > 90


@pytest.mark.parametrize(
    ("name", "recipient", "status"),
    [
        ("dsn_01.txt", "userx@example.com", "5.0.0"),  # Original- over Final-Recipient
        ("dsn_05.txt", "userx@example.cz", "4.4.1"),
        ("dsn_11.txt", "joem@example.com", "5.1.1"),  # <angle brackets> dropped
        ("dsn_14.txt", "userx@example.com.dk", "5.1.1"),
        ("qmail_03.txt", "userx@example.jp", "5.1.1"),  # code found in the text
        ("exim_01.txt", "userx@its.example.nl", "5.1.1"),
    ],
)
def test_known_bounces_give_their_status(name: str, recipient: str, status: str) -> None:
    _flufl_files()
    report = read_bounce((FLUFL_DATA / name).read_bytes())
    assert report is not None
    assert (report.recipient, report.status) == (recipient, status)


def test_only_the_first_mib_is_read() -> None:
    dsn = postfix_dsn("a+bounce-1-x@help.example", "bob@example.net")
    head, end = dsn.rsplit(b"--\r\n", 1)
    # The returned message, however long, follows the report: the report is still read.
    padded = head.replace(b"Subject: Re: hello\r\n", b"Subject: Re: hello\r\n" + b"x" * 2_000_000)
    report = read_bounce(padded + b"--\r\n" + end)
    assert report is not None
    assert report.status == "5.1.1"
    # A report pushed past the first MiB is not looked for.
    late = dsn.replace(b"This is a MIME-encapsulated message.", b"y" * (READ_BYTES + 10))
    assert read_bounce(late) is None
