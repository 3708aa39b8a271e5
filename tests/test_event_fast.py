"""The fast paths of build_event agree with the general code wherever they answer.

Each fast path answers only for a common simple form and otherwise says "not
simple" (None) or hands over to the general code; these tests hold every
answer against the general code (or against the stdlib parser it stands in
for), on examples and on generated input, and check that the common forms
do take the fast path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masd.core.comments import _strip_comments_scan
from masd.core.decoding import b64decode, b64repair
from masd.core.event import (
    ParsedMail,
    _first_of,
    _one_line,
    _params,
    _read_params,
    _split_entity,
    _split_lines,
    _split_multipart,
    _split_simple,
    build_event,
)
from masd.core.mime import lf as _lf
from masd.core.trust import (
    TrustSettings,
    _split_resinfo_scan,
    read_auth,
    read_automation,
    split_resinfo,
    strip_comments,
)

MAIL = Path(__file__).resolve().parent / "mail"
TRUST = TrustSettings.of(["mx.help.example"])
SLOW = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(raw: bytes) -> ParsedMail:
    return build_event(
        raw,
        mail_from="a@example.org",
        rcpt_to="ticket@help.example",
        received_at="2025-01-06T10:00:05Z",
        message_ref="m-1",
        trust=TRUST,
    )


# ---------------------------------------------------------------------------
# Headers: _split_simple against _split_lines


_HEADER_PIECES = [
    *(b"From", b"Subject", b"X-A", b"Content-Type", b"From ", b"a b"),
    *(b"\xc3\xa9", b"\xff", b"\xe2\x82"),
    *(b":", b": ", b" :", b"\t:", b"value", b"=?utf-8?q?x?=", b"\x00", b'x;y="z"'),
    *(b"\n", b"\r\n", b"\r", b"\r\r\n", b"\n ", b"\r\n\t", b"\n\n", b"\r\n\r\n", b"\n\r\n"),
    *(b" ", b"\t", b"body", b"--b"),
]


@SLOW
@given(st.lists(st.sampled_from(_HEADER_PIECES), max_size=40).map(b"".join))
def test_split_simple_agrees_with_split_lines(data: bytes) -> None:
    simple = _split_simple(data)
    if simple is not None:
        assert simple == _split_lines(data)


_header_lines = st.lists(
    st.tuples(
        st.sampled_from([b"From", b"Subject", b"X-A", b"Subject", b"From", b"a b", b""]),
        st.sampled_from([b":", b": ", b": ", b" :", b"\t: ", b""]),
        st.lists(
            st.sampled_from([b"v", b" ", b"\t", b"v", b"\xc3\xa9", b"\xff", b"\r"]), max_size=5
        ),
        st.lists(st.sampled_from([b" more", b"\tmore", b"  ", b" \r"]), max_size=2),
        st.sampled_from([b"\n", b"\r\n", b"\n", b"\r\n", b"\r\r\n"]),
    ),
    max_size=5,
)


@pytest.mark.slow
@SLOW
@given(
    _header_lines, st.sampled_from([b"\n", b"\r\n", b"", b"\r"]), st.sampled_from([b"", b"body\n"])
)
def test_split_simple_agrees_on_header_shaped_bytes(
    lines: list[tuple[bytes, bytes, list[bytes], list[bytes], bytes]], blank: bytes, body: bytes
) -> None:
    fields = [
        name + colon + b"".join(value) + nl + b"".join(more + nl for more in conts)
        for name, colon, value, conts, nl in lines
    ]
    data = b"".join(fields) + blank + body
    simple = _split_simple(data)
    if simple is not None:
        assert simple == _split_lines(data)


@SLOW
@given(st.binary(max_size=300))
def test_split_simple_agrees_on_any_bytes(data: bytes) -> None:
    simple = _split_simple(data)
    if simple is not None:
        assert simple == _split_lines(data)


@pytest.mark.parametrize("path", sorted(MAIL.glob("*.eml")), ids=lambda p: p.stem)
def test_split_simple_agrees_on_the_corpus(path: Path) -> None:
    raw = path.read_bytes()
    for data in (raw, raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")):
        simple = _split_simple(data)
        if simple is not None:
            assert simple == _split_lines(data)


def test_split_simple_answers_for_plain_mail() -> None:
    for nl in (b"\n", b"\r\n"):
        raw = nl.join(
            [
                b"From: <bench@example.org>",
                b"Subject: folded",
                b"\tover two lines  ",
                b"Date: Mon, 6 Jan 2025 10:00:00 +0000",
                b"",
                b"body",
            ]
        )
        headers, body = _split_entity(raw)
        assert _split_simple(raw) == (headers, body)
        assert headers[1] == ("Subject", "folded\tover two lines")
        assert body == b"body"


@pytest.mark.parametrize(
    "raw",
    [
        b"From: a@b.example\nnot a header\n\nbody",  # the body starts early
        b"From: a@b.example",  # no empty line
        b"Subject: caf\xe9\n\nbody",  # not UTF-8
        b"Subject: a\rb\n\nbody",  # a CR that ends no line
        b" continued\nFrom: a@b.example\n\nbody",
    ],
)
def test_split_simple_declines_what_it_does_not_read(raw: bytes) -> None:
    assert _split_simple(raw) is None
    assert _split_entity(raw) == _split_lines(raw)


# ---------------------------------------------------------------------------
# MIME: the delimiter scan against the delimiter regex


def _split_multipart_regex(data: bytes, boundary: str) -> list[bytes]:
    """The delimiter search as one regex (RFC 2046 §5.1.1), for comparison."""
    delimiter = re.compile(
        rb"^--" + re.escape(boundary.encode("utf-8", "replace")) + rb"(--)?[ \t]*\r?$",
        re.MULTILINE,
    )
    parts: list[bytes] = []
    start: int | None = None
    for m in delimiter.finditer(data):
        if start is not None:
            end = m.start()
            if end > start and data[end - 1 : end] == b"\n":
                end -= 2 if end - 1 > start and data[end - 2 : end - 1] == b"\r" else 1
            parts.append(data[start:end])
        if m.group(1):
            return parts
        nl = data.find(b"\n", m.end())
        start = len(data) if nl < 0 else nl + 1
    if start is not None and start <= len(data):
        parts.append(data[start:])
    return parts


_MIME_PIECES = [
    *(b"--b", b"--b--", b"--b-", b"---b", b"--bb", b"b", b"-", b"--"),
    *(b"\n", b"\r\n", b"\r", b" ", b"\t", b"x", b"Content-Type: text/plain", b".*"),
]


_mime_lines = st.lists(
    st.tuples(
        st.sampled_from([b"--b", b"--b--", b"--b", b"--b-", b"--bx", b"x--b", b"text", b""]),
        st.sampled_from([b"", b"", b" ", b"\t ", b"--", b"\r"]),
        st.sampled_from([b"\n", b"\r\n", b"\n", b"\r"]),
    ),
    max_size=12,
)


@pytest.mark.slow
@SLOW
@given(_mime_lines, st.sampled_from(["b", "b-", "b--"]), st.booleans())
def test_split_multipart_agrees_on_delimiter_shaped_bytes(
    lines: list[tuple[bytes, bytes, bytes]], boundary: str, cut: bool
) -> None:
    data = b"".join(a + b + c for a, b, c in lines)
    if cut and data:
        data = data[:-1]
    assert _split_multipart(data, boundary) == _split_multipart_regex(data, boundary)


@SLOW
@given(
    st.lists(st.sampled_from(_MIME_PIECES), max_size=40).map(b"".join),
    st.sampled_from(["b", "b-", "-b", ".*", "b b", "é"]),
)
def test_split_multipart_agrees_with_the_regex(data: bytes, boundary: str) -> None:
    data = data.replace(b".*", boundary.encode("utf-8"))
    assert _split_multipart(data, boundary) == _split_multipart_regex(data, boundary)


@pytest.mark.parametrize("path", sorted(MAIL.glob("*.eml")), ids=lambda p: p.stem)
def test_split_multipart_agrees_on_the_corpus(path: Path) -> None:
    raw = path.read_bytes()
    for match in re.finditer(rb'boundary="?([^";\r\n]+)', raw):
        boundary = match.group(1).decode("utf-8", "replace")
        assert _split_multipart(raw, boundary) == _split_multipart_regex(raw, boundary)


# ---------------------------------------------------------------------------
# Small helpers


@SLOW
@given(st.text(alphabet=st.sampled_from("ab\r\n\t\x00 é"), max_size=40))
def test_lf_is_the_two_replaces(text: str) -> None:
    assert _lf(text) == text.replace("\r\n", "\n").replace("\r", "\n")


@SLOW
@given(st.text(max_size=40))
def test_one_line_is_the_control_substitution(text: str) -> None:
    assert _one_line(text) == re.sub(r"[\x00-\x08\x0a-\x1f\x7f]+", " ", text).strip()


_COMMENT_PIECES = [*'ab;=()\\" \t', "dmarc=pass", "(x;y)", "((n))", "é"]


@SLOW
@given(st.lists(st.sampled_from(_COMMENT_PIECES), max_size=30).map("".join))
def test_comment_fast_paths_agree_with_the_scans(value: str) -> None:
    assert strip_comments(value) == _strip_comments_scan(value)
    assert split_resinfo(value) == _split_resinfo_scan(value)


def test_comment_fast_paths_cover_the_usual_headers() -> None:
    ar = "mx.help.example; dkim=pass (2048-bit key; unprotected) header.d=x; dmarc=pass"
    assert split_resinfo(ar) == [
        "mx.help.example",
        " dkim=pass (2048-bit key; unprotected) header.d=x",
        " dmarc=pass",
    ]
    assert strip_comments("from a (a [192.0.2.1]) by mx (Postfix)") == "from a   by mx  "


@pytest.mark.parametrize(
    "value",
    [
        "text/plain; charset=utf-8",
        'multipart/alternative; boundary="a b"',
        "attachment; filename*0*=utf-8''%E2%82; filename*1=%AC.txt",
        'text/plain (comment); charset="x\\"y"',
    ],
)
def test_cached_params_equal_a_fresh_read(value: str) -> None:
    assert _params(value) == _read_params(value)
    assert _params(value) == _read_params(value)  # the cached answer, once more


def test_first_of_is_the_first_value_of_each_name() -> None:
    headers = [("Content-Type", "a"), ("content-type", "b"), ("X", "c")]
    assert _first_of(headers) == {"content-type": "a", "x": "c"}


_OTHER_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(["From", "To", "Subject", "X-Received", "Received-SPF", "ARC-Seal"]),
        st.text(max_size=20),
    ),
    max_size=5,
)


@given(_OTHER_HEADERS, st.sampled_from(["", "<>", "a@example.org"]))
def test_trust_readers_ignore_other_headers(headers: list[tuple[str, str]], sender: str) -> None:
    # build_event hands these readers no headers when none of theirs is there.
    froms = ("a@example.org",)
    assert read_auth(headers, froms, TRUST) == read_auth((), froms, TRUST)
    assert read_automation(headers, sender) == read_automation((), sender)


@pytest.mark.parametrize(
    ("header", "dmarc", "automated"),
    [
        ("Authentication-Results: mx.help.example; dmarc=fail", "fail", False),
        ("Received: by mx.help.example; Mon, 6 Jan 2025 10:00:00 +0000", "absent", False),
        ("Precedence: bulk", "absent", True),
        ("Auto-Submitted: auto-replied", "absent", True),
        ("X-Other: 1", "absent", False),
    ],
)
def test_each_trust_header_alone_is_read(header: str, dmarc: str, automated: bool) -> None:
    parsed = build(f"From: a@example.org\n{header}\n\nhi\n".encode())
    assert parsed.auth.dmarc == dmarc
    assert parsed.automation.is_automated is automated


# ---------------------------------------------------------------------------
# base64: the in-place C decoder against the repairing path

_B64_PIECES = st.sampled_from(
    [b"QUJD", b"QQ", b"Q", b"=", b"==", b"\r\n", b" ", b"!", b"\x00", b"\xff", b"+/9z"]
)


@SLOW
@given(st.lists(_B64_PIECES, max_size=20).map(b"".join))
def test_b64decode_agrees_with_the_repairing_path(data: bytes) -> None:
    assert b64decode(data) == b64repair(data)
    assert b64decode(memoryview(data)) == b64repair(data)


@SLOW
@given(st.binary(max_size=100))
def test_b64decode_agrees_on_any_bytes(data: bytes) -> None:
    assert b64decode(data) == b64repair(data)
