"""RFC 5322 addresses and message ids (masd/core/rfc5322.py), read without email.utils."""

from __future__ import annotations

from email.utils import getaddresses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masd.core.rfc5322 import Mailbox, _plain, mailboxes, msg_id, msg_ids, read_mailboxes

SLOW = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

READINGS = [
    ("a@example.org", [("", "a@example.org")]),
    ("<a@example.org>", [("", "a@example.org")]),
    ("Pat Kim <pat@example.org>", [("Pat Kim", "pat@example.org")]),
    ("Pat  Kim   <pat@example.org>", [("Pat Kim", "pat@example.org")]),
    ('"Kim, Pat" <pat@example.org>', [("Kim, Pat", "pat@example.org")]),
    ("J. Doe <j.doe@Example.ORG>", [("J. Doe", "j.doe@Example.ORG")]),
    ("=?utf-8?q?Jos=C3=A9?= <j@example.org>", [("=?utf-8?q?Jos=C3=A9?=", "j@example.org")]),
    ("Müller <m@example.org>", [("Müller", "m@example.org")]),
    # comments are whitespace, never a name
    ("a@example.org (Pat Kim)", [("", "a@example.org")]),
    ("Pat (boss) <pat@example.org>", [("Pat", "pat@example.org")]),
    ("Pat (a (nested) comment) Kim <p@x.example>", [("Pat Kim", "p@x.example")]),
    ('"Kim \\"P\\"" <pat@example.org>', [('Kim "P"', "pat@example.org")]),
    (
        "Pat <pat@example.org>, Lee <lee@example.org>",
        [("Pat", "pat@example.org"), ("Lee", "lee@example.org")],
    ),
    ("group: a@b.example, c@d.example;", [("", "a@b.example"), ("", "c@d.example")]),
    ("undisclosed-recipients:;", []),
    # the obsolete forms RFC 5322 §4 accepts
    ("Pat <a @ b.example>", [("Pat", "a@b.example")]),
    ("Pat <@route.example,@other.example:a@b.example>", [("Pat", "a@b.example")]),
    ("john . doe @ example . org", [("", "john.doe@example.org")]),
    ("Dr. J. R. Doe <d@example.org>", [("Dr. J. R. Doe", "d@example.org")]),
    (", , a@example.org", [("", "a@example.org")]),
    ('"quoted local"@example.org', [("", '"quoted local"@example.org')]),
    ('"plain"@example.org', [("", "plain@example.org")]),
    ("a@[192.0.2.1]", [("", "a@[192.0.2.1]")]),
    # repairs of what real mail software writes
    (
        "tim@powerupdev.com concierge@powerupdev.com",
        [("", "tim@powerupdev.com"), ("", "concierge@powerupdev.com")],
    ),
    ("alice@example.com <bob@example.com>", [("alice@example.com", "bob@example.com")]),
    ("John Doe jdoe@example.com", [("John Doe", "jdoe@example.com")]),
    ("Pat <pat@example.org> junk", [("Pat", "pat@example.org")]),
    ("Pat <>", []),
    ("", []),
    ("no address here", []),
]


@pytest.mark.parametrize(("value", "want"), READINGS)
def test_readings(value: str, want: list[tuple[str, str]]) -> None:
    assert mailboxes(value) == [Mailbox(*pair) for pair in want]
    assert read_mailboxes(value) == [Mailbox(*pair) for pair in want]


@pytest.mark.parametrize(("value", "want"), READINGS[:8])
def test_plain_forms_read_as_the_stdlib_reads_them(value: str, want: list[tuple[str, str]]) -> None:
    assert getaddresses([value]) == want
    assert _plain(value) == Mailbox(*want[0])


_PIECES = [
    *("Pat", "Kim", "J.", ".", "a", "b", "x.y", "=?utf-8?q?a?=", "é", "\\", "'", "!"),
    *(" ", "  ", "\t", "\x00", "\xa0"),
    *('"', "<", ">", "@", ",", ":", ";", "(", ")", "[", "]"),
    *("<a@example.org>", "a@example.org", "@example.org", "a.b@c.d", "example.org>"),
]


@SLOW
@given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join))
def test_the_plain_path_agrees_with_the_general_reading(value: str) -> None:
    plain = _plain(value)
    if plain is not None:
        assert read_mailboxes(value) == [plain]


@SLOW
@given(st.text(max_size=60))
def test_any_text_reads_without_error_and_gives_addresses(value: str) -> None:
    for box in mailboxes(value):
        assert "@" in box.address


def test_long_hostile_values_read_in_linear_time() -> None:
    assert mailboxes("(" * 100_000) == []
    assert len(mailboxes("a@b.example " * 20_000)) == 20_000
    assert mailboxes("<" * 50_000 + "a@b.example") == []
    # a dot-chain or a run of words that never reaches "@" is walked once, not once per word
    assert mailboxes("a." * 50_000) == []
    assert mailboxes("a " * 50_000 + "b@c.example") == [Mailbox("a " * 49_999 + "a", "b@c.example")]


IDS = [
    ("<abc@example.org>", ["<abc@example.org>"]),
    ("<abc@example.org", ["<abc@example.org>"]),
    ("<abc @ example.org>", ["<abc@example.org>"]),
    ("(comment) <a@b> (another)", ["<a@b>"]),
    ("<a@b><c@d>", ["<a@b>", "<c@d>"]),
    ("<a@b <c@d>", ["<a@b>", "<c@d>"]),
    ("Your message of Monday <a@b>", ["<a@b>"]),
    ("abc@example.org", ["<abc@example.org>"]),
    ("abc @ example.org", ["<abc@example.org>"]),
    ("12345", ["<12345>"]),
    ("a@b c@d", ["<a@b>", "<c@d>"]),
    ("<>", []),
    ("", []),
]


@pytest.mark.parametrize(("value", "want"), IDS)
def test_message_ids(value: str, want: list[str]) -> None:
    assert msg_ids(value) == want
    assert msg_id(value) == (want[0] if want else None)
