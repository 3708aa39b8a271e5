"""The LMTP edge's fast MAIL/RCPT path reader agrees with aiosmtpd's parser.

``plain_path`` answers only for the plain ``<local@domain>`` form and must give
exactly what aiosmtpd's own path reader gives there; everything else goes to
aiosmtpd unchanged.  Checked here against aiosmtpd itself, and through a real
LMTP session.
"""

from __future__ import annotations

import pytest
from aiosmtpd.handlers import Sink
from aiosmtpd.smtp import SMTP
from hypothesis import example, given, settings
from hypothesis import strategies as st

from masd.edges.lmtp_session import LmtpProtocol, plain_path, read_path

REFERENCE = SMTP(Sink())

PLAIN = [
    ("<alice@example.org>", ("alice@example.org", "")),
    (
        "<ticket@help.example> SIZE=2048 BODY=8BITMIME",
        ("ticket@help.example", "SIZE=2048 BODY=8BITMIME"),
    ),
    ("<ticket=gs-1@help.example>", ("ticket=gs-1@help.example", "")),
    ("<ticket!callback@help.example>", ("ticket!callback@help.example", "")),
    ("<first.last+tag@mail-1.example.co>", ("first.last+tag@mail-1.example.co", "")),
    ("<a@b>\tX=1", ("a@b", "X=1")),
    ("<a@b>   ", ("a@b", "")),
]

# Forms left to aiosmtpd: quoted, routed, literal, UTF-8, null, malformed.
NOT_PLAIN = [
    "<>",
    "<> BODY=8BITMIME",
    '<"a b"@example.org>',
    '<"abc"@example.org>',
    "<@relay.example:a@example.org>",
    "<a@[192.0.2.1]>",
    "<ä@example.de>",
    "<a@bü.de>",
    "a@example.org",
    "<a@example.org",
    "<a>",
    "<a@>",
    "<@b>",
    "<a..b@c>",
    "<.a@b>",
    "<a.@b>",
    "<a@b.>",
    "<a@b@c>",
    "<a@b>x",
    "<a@b>,<c@d>",
    "<a (comment)@b>",
    "<a@b> (comment) SIZE=1",
    "",
]


@pytest.mark.parametrize(("arg", "expected"), PLAIN)
def test_plain_paths(arg: str, expected: tuple[str, str]) -> None:
    assert plain_path(arg) == expected
    assert read_path(REFERENCE, arg) == expected


@pytest.mark.parametrize("arg", NOT_PLAIN)
def test_other_forms_go_to_aiosmtpd(arg: str) -> None:
    assert plain_path(arg) is None


def test_the_edge_still_reads_other_forms_as_aiosmtpd_does() -> None:
    protocol = LmtpProtocol.__new__(LmtpProtocol)
    protocol.local_part_limit = 0
    for arg in NOT_PLAIN:
        assert read_path(protocol, arg) == read_path(REFERENCE, arg), arg


def test_the_local_part_limit_still_holds() -> None:
    protocol = LmtpProtocol.__new__(LmtpProtocol)
    protocol.local_part_limit = 5
    assert read_path(protocol, "<abcde@example.org>") == ("abcde@example.org", "")
    assert read_path(protocol, "<abcdef@example.org>") == (None, None)


# Strings built from the pieces paths are made of, so that many are plain and
# many are nearly plain (a stray dot, bracket, quote, space or parenthesis).
_PIECES = st.sampled_from(
    [
        "a",
        "Z",
        "9",
        "-",
        "_",
        "+",
        "=",
        "!",
        "~",
        "'",
        ".",
        "..",
        "@",
        "<",
        ">",
        " ",
        "\t",
        '"',
        "(",
        ")",
        "[",
        "]",
        ":",
        ",",
        "\\",
        "ä",
        "SIZE=1",
        "BODY=8BITMIME",
        "x.example",
    ]
)


@pytest.mark.slow
@settings(max_examples=3000)
@given(st.lists(_PIECES, max_size=12).map("".join))
@example("<a@b> X=1 ")
@example("<a@b> \t ")
@example("<a-@-b>")
def test_plain_path_agrees_with_aiosmtpd(arg: str) -> None:
    plain = plain_path(arg)
    if plain is not None:
        assert plain == read_path(REFERENCE, arg)


@given(
    st.from_regex(
        r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,8}(\.[A-Za-z0-9+=-]{1,5}){0,2}", fullmatch=True
    ),
    st.from_regex(r"[A-Za-z0-9-]{1,8}(\.[A-Za-z0-9-]{1,6}){0,3}", fullmatch=True),
    st.sampled_from(["", " SIZE=10", "\tBODY=8BITMIME", "  SIZE=1 BODY=7BIT "]),
)
def test_every_plain_path_is_read_fast_and_the_same(local: str, domain: str, params: str) -> None:
    arg = f"<{local}@{domain}>{params}"
    assert plain_path(arg) is not None
    assert plain_path(arg) == read_path(REFERENCE, arg)
