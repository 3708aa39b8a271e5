"""The gateway event: the corpus in tests/mail, the schema, and properties."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masd.core.errors import EventError
from masd.core.event import (
    MAX_ATTACHMENTS,
    MAX_REFERENCES,
    MAX_TEXT_BYTES,
    Attachment,
    GatewayEvent,
    build_event,
    decode_words,
)
from masd.core.trust import TrustSettings

ROOT = Path(__file__).resolve().parent.parent
MAIL = ROOT / "tests" / "mail"
SCHEMA = json.loads(
    (ROOT / "conformance" / "schema" / "mas-event-v0.1.schema.json").read_text("utf-8")
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
TRUST = TrustSettings.of(["mx.help.example"])
RECEIVED_AT = "2025-01-06T10:00:05Z"

sys.path.insert(0, str(MAIL))
import make_corpus  # noqa: E402

CASES = sorted(p.stem for p in MAIL.glob("*.json"))


def load(name: str) -> tuple[dict[str, Any], bytes]:
    meta = json.loads((MAIL / f"{name}.json").read_text("utf-8"))
    if "generate" in meta:
        raw = make_corpus.RECIPES[meta["generate"]]()
    else:
        raw = (MAIL / f"{name}.eml").read_bytes()
    return meta, raw


def build(raw: bytes, mail_from: str = "a@example.org", rcpt_to: str = "ticket@help.example"):
    return build_event(
        raw,
        mail_from=mail_from,
        rcpt_to=rcpt_to,
        received_at=RECEIVED_AT,
        message_ref="m-1",
        trust=TRUST,
    )


def test_corpus_is_big_enough() -> None:
    assert len(CASES) >= 30
    for name in CASES:
        meta, _ = load(name)
        assert meta["description"]
        assert ("expect" in meta) != ("error" in meta), name


@pytest.mark.parametrize("name", CASES)
def test_corpus(name: str) -> None:
    meta, raw = load(name)
    envelope = meta["envelope"]
    if "error" in meta:
        with pytest.raises(EventError) as info:
            build(raw, envelope["mail_from"], envelope["rcpt_to"])
        assert info.value.code == meta["error"]["code"]
        return
    parsed = build(raw, envelope["mail_from"], envelope["rcpt_to"])
    data = parsed.event.to_json()
    VALIDATOR.validate(data)
    for key, want in meta["expect"].items():
        assert data[key] == want, f"{name}: {key}"
    auth = meta["auth"]
    assert parsed.auth.dmarc == auth["dmarc"]
    assert parsed.auth.authenticated is auth["authenticated"]
    assert parsed.auth.authserv_id == auth["authserv_id"]
    assert parsed.auth.header_from == auth["header_from"]
    assert data["auth"]["dmarc"] == auth["dmarc"]
    assert data["automated"] == meta["automated"]
    assert parsed.automation.is_automated is meta["automated"]["is"]
    if "from_addresses" in meta:
        assert list(parsed.from_addresses) == meta["from_addresses"]
    assert GatewayEvent.from_json(json.loads(json.dumps(data))) == parsed.event


def test_raw_bytes_are_not_changed() -> None:
    _, raw = load("nested_rfc822")
    copy = bytes(raw)
    build(raw)
    assert raw == copy


def test_deeply_nested_comments_do_not_overflow_the_stack() -> None:
    deep = "(" * 5000
    raw = msg(
        f"Authentication-Results: mx.help.example; dmarc=pass {deep}\n"
        f"From: Pat {deep} <pat@example.org>\nReceived: {deep}"
    )
    parsed = build(raw)
    assert parsed.auth.dmarc == "fail"  # the comment swallowed header.from
    assert parsed.from_addresses == ()  # the comment swallowed the address too


def test_deep_mime_nesting_stops_at_the_limit() -> None:
    levels = "".join(
        f'--b{i}\nContent-Type: multipart/mixed; boundary="b{i + 1}"\n\n' for i in range(200)
    )
    raw = msg('Content-Type: multipart/mixed; boundary="b0"', levels + "--b200\n\nbottom\n")
    event = build(raw).event
    assert event.text == ""
    assert [a.content_type for a in event.attachments] == ["multipart/mixed"]


def test_html_is_read_by_the_html5_parser() -> None:
    from masd.core.htmltext import html_to_text as _html_to_text

    doc = "a < b <a x='>'<a <!x> <?php ?> <![CDATA[x]]> <!-- <b>c</b> --> <!-- open"
    assert _html_to_text(doc) == "a < b"
    assert _html_to_text("<p>1 < 2</p><!-- <p>hidden</p> --><SCRIPT>x<y</script>z") == "1 < 2\n\nz"


# ---------------------------------------------------------------------------
# Bounds


def msg(headers: str, body: str = "hi\n") -> bytes:
    return (headers.rstrip("\n") + "\n\n" + body).encode("utf-8")


def test_text_is_cut_at_256_kib_on_a_character_boundary() -> None:
    body = "é" * (MAX_TEXT_BYTES // 2) + "tail"
    text = build(msg("From: a@example.org\nContent-Type: text/plain; charset=utf-8", body))
    out = text.event.text
    assert len(out.encode("utf-8")) <= MAX_TEXT_BYTES
    assert out == "é" * (MAX_TEXT_BYTES // 2)
    odd = "x" + "é" * (MAX_TEXT_BYTES // 2)
    out = build(msg("Content-Type: text/plain; charset=utf-8", odd)).event.text
    assert out == "x" + "é" * (MAX_TEXT_BYTES // 2 - 1)


def test_references_keep_the_root_and_the_latest() -> None:
    refs = " ".join(f"<r{i}@example.org>" for i in range(150))
    event = build(msg(f"References: {refs}")).event
    assert len(event.references) == MAX_REFERENCES
    assert event.references[0] == "<r0@example.org>"
    assert event.references[1] == "<r51@example.org>"
    assert event.references[-1] == "<r149@example.org>"


def test_attachments_are_capped() -> None:
    parts = "".join(
        f"--b\nContent-Type: application/octet-stream\n\npart {i}\n" for i in range(150)
    )
    event = build(msg('Content-Type: multipart/mixed; boundary="b"', parts + "--b--\n")).event
    assert len(event.attachments) == MAX_ATTACHMENTS
    assert event.attachments[0].sha256 == hashlib.sha256(b"part 0").hexdigest()


def test_long_fields_are_truncated() -> None:
    name = "N" * 400
    local = "l" * 400
    event = build(
        msg(f"From: {name} <{local}@example.org>\nMessage-ID: <{'i' * 1200}@x>\nDate: {'d' * 300}"),
        mail_from="m" * 400 + "@example.org",
        rcpt_to="r" * 400 + "@help.example",
    ).event
    assert event.from_name == "N" * 256
    assert len(event.from_address) == 320
    assert event.message_id is not None
    assert len(event.message_id) == 998
    assert event.date == "d" * 256
    assert len(event.mail_from) == 320
    assert len(event.rcpt_to) == 320
    VALIDATOR.validate(event.to_json())


def test_control_characters_never_reach_header_fields() -> None:
    event = build(
        msg("Subject: =?utf-8?q?a=0D=0Ab=00c?=\nFrom: =?utf-8?q?x=0Ay?= <a@b.example>")
    ).event
    assert event.subject == "a b c"
    assert event.from_name == "x y"


def test_null_sender_is_empty_string() -> None:
    assert build(msg("From: a@example.org"), mail_from="<>").event.mail_from == ""
    assert build(msg("From: a@example.org"), mail_from="").event.mail_from == ""
    assert build(msg("From: a@example.org"), mail_from="<a@b.example>").event.mail_from == (
        "a@b.example"
    )


def test_bare_message_id_gets_brackets() -> None:
    assert build(msg("Message-ID: abc@example.org")).event.message_id == "<abc@example.org>"
    assert build(msg("Message-ID: not an id")).event.message_id is None


def test_decode_words() -> None:
    assert decode_words("=?utf-8?q?a?= =?utf-8?q?b?=") == "ab"
    assert decode_words("=?utf-8?q?a?= x =?utf-8?q?b?=") == "a x b"
    assert decode_words("plain =?bogus?b?!!!?= text") == "plain  text"
    assert decode_words("=?utf-8*en?q?caf=C3=A9?=") == "café"
    assert decode_words("=?undefined?q?x?=") == "x"
    assert decode_words("=?unicode-escape?q?=5Cud800?=") == "\\ud800"


# ---------------------------------------------------------------------------
# Caller errors and from_json


def test_bad_received_at_is_refused() -> None:
    with pytest.raises(EventError) as info:
        build_event(
            b"",
            mail_from="",
            rcpt_to="t@help.example",
            received_at="yesterday",
            message_ref="m",
            trust=TRUST,
        )
    assert info.value.code == "invalid-event"
    assert "received_at" in info.value.detail


def test_empty_message_ref_is_refused() -> None:
    with pytest.raises(EventError, match="message_ref"):
        build_event(
            b"",
            mail_from="",
            rcpt_to="t@help.example",
            received_at=RECEIVED_AT,
            message_ref="",
            trust=TRUST,
        )


def good_event() -> dict[str, Any]:
    _, raw = load("rfc2231_filename")
    return build(raw).event.to_json()


def test_from_json_ignores_unknown_fields() -> None:
    data = good_event()
    data["x-extra"] = {"anything": 1}
    data["from"]["x-more"] = True
    data["attachments"][0]["x-note"] = "ok"
    assert GatewayEvent.from_json(data).to_json() == good_event()


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("subject",), None, "subject"),
        (("subject",), "s" * 999, "subject"),
        (("references",), "<a@b>", "references"),
        (("references",), ["<a@b>"] * 101, "references"),
        (("from", "address"), 5, "from.address"),
        (("from", "name"), "n" * 257, "from.name"),
        (("auth", "dmarc"), "maybe", "auth.dmarc"),
        (("automated", "is"), "yes", "automated.is"),
        (("attachments",), [{"filename": None}], "content_type"),
        (("attachments", 0, "size"), -1, "size"),
        (("attachments", 0, "size"), True, "size"),
        (("attachments", 0, "sha256"), "ABC", "sha256"),
        (("received_at",), "2025-01-06 10:00", "received_at"),
        (("text",), "x" * (MAX_TEXT_BYTES + 1), "text"),
    ],
)
def test_from_json_refuses_bad_fields(path: tuple[Any, ...], value: Any, needle: str) -> None:
    data = good_event()
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(EventError) as info:
        GatewayEvent.from_json(data)
    assert info.value.code == "invalid-event"
    assert needle in info.value.detail


@pytest.mark.parametrize("key", ["message_ref", "from", "auth", "automated", "text", "date"])
def test_from_json_refuses_missing_fields(key: str) -> None:
    data = good_event()
    del data[key]
    with pytest.raises(EventError, match=key):
        GatewayEvent.from_json(data)


def test_from_json_refuses_a_non_object() -> None:
    with pytest.raises(EventError):
        GatewayEvent.from_json([])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Properties


def _check_any(raw: bytes, mail_from: str) -> None:
    try:
        parsed = build(raw, mail_from=mail_from)
    except EventError:  # pragma: no cover - build_event refuses no content today
        return
    data = parsed.event.to_json()
    VALIDATOR.validate(data)
    assert GatewayEvent.from_json(json.loads(json.dumps(data))) == parsed.event


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096), st.text(max_size=40))
def test_any_bytes_give_a_valid_event(raw: bytes, mail_from: str) -> None:
    _check_any(raw, mail_from)


_FRAGMENTS = [
    b"From: ",
    b"Subject: ",
    b"Content-Type: ",
    b"multipart/mixed; boundary=",
    b'"b"',
    b"b",
    b"--b",
    b"--b--",
    b"\n",
    b"\r\n",
    b"\r",
    b" ",
    b"\t",
    b"text/html",
    b"text/plain",
    b"message/rfc822",
    b"; charset=",
    b"shift_jis",
    b"utf-7",
    b"x-bogus",
    b"Content-Transfer-Encoding: ",
    b"base64",
    b"quoted-printable",
    b"=?utf-8?b?",
    b"=?iso-8859-1?q?",
    b"?=",
    b"=C3",
    b"=\n",
    b"Content-Disposition: attachment; filename*0*=utf-8''%E2%82",
    b"; name*1=",
    b"<a@b>",
    b"Authentication-Results: mx.help.example; dmarc=pass header.from=",
    b"Received: by ",
    b"mx.help.example",
    b"(",
    b")",
    b'"',
    b"\\",
    b"<p>",
    b"<script>",
    b"&amp;",
    b"&#",
    b"\xff",
    b"\xe9",
    b"\x00",
    b"\xe2\x82\xac",
    b"a@b.example",
    b",",
    b";",
    b"=",
    b"Auto-Submitted: ",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=80))
def test_mime_shaped_bytes_give_a_valid_event(pieces: list[bytes]) -> None:
    _check_any(b"".join(pieces), "a@example.org")


_texts = st.text(max_size=30)
_opt = st.none() | _texts
_events = st.builds(
    GatewayEvent,
    message_ref=st.text(min_size=1, max_size=20),
    received_at=st.sampled_from(["2025-01-06T10:00:05Z", "2025-01-06t10:00:05.123+01:00"]),
    mail_from=_texts,
    rcpt_to=_texts,
    message_id=_opt,
    in_reply_to=_opt,
    references=st.lists(_texts, max_size=5).map(tuple),
    from_address=_texts,
    from_name=_opt,
    subject=_texts,
    date=_opt,
    text=st.text(max_size=200),
    attachments=st.lists(
        st.builds(
            Attachment,
            filename=_opt,
            content_type=_texts,
            size=st.integers(min_value=0, max_value=2**40),
            sha256=st.binary(min_size=1, max_size=8).map(lambda b: hashlib.sha256(b).hexdigest()),
        ),
        max_size=3,
    ).map(tuple),
    dmarc=st.sampled_from(["pass", "fail", "none", "temperror", "permerror", "absent"]),
    authserv_id=_opt,
    automated=st.booleans(),
    automated_reason=_opt,
)


@given(_events)
def test_json_round_trip(event: GatewayEvent) -> None:
    data = json.loads(json.dumps(event.to_json()))
    VALIDATOR.validate(data)
    assert GatewayEvent.from_json(data) == event
