"""The reading rules of docs/protocol.md §15 ("Mail as it arrives"), one form each.

Every case here is a form real mail software writes that masd once read wrong:
the text lost to a filename, digests, boundaries that never occur, uuencode,
8-bit bytes in encoded words, From and Message-ID damage, attachment lists
cut short, TNEF and forwarded messages.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import subprocess
from pathlib import Path

from support.system import require_program

from masd.core.event import MAX_ATTACHMENTS, GatewayEvent, ParsedMail, build_event
from masd.core.trust import TrustSettings

TRUST = TrustSettings.of(["mx.help.example"])


def build(raw: bytes) -> ParsedMail:
    return build_event(
        raw.replace(b"\n", b"\r\n"),
        mail_from="a@example.org",
        rcpt_to="ticket@help.example",
        received_at="2025-01-06T10:00:05Z",
        message_ref="m-1",
        trust=TRUST,
    )


def event(raw: bytes) -> GatewayEvent:
    return build(raw).event


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


HEAD = b"From: a@example.org\nTo: ticket@help.example\nSubject: s\nMIME-Version: 1.0\n"


def test_a_text_part_with_a_filename_is_still_the_text() -> None:
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\n"
        b'Content-Type: text/plain; charset=utf-8; name="msg.txt"\n'
        b'Content-Disposition: inline; filename="msg.txt"\n\nhello there\n'
        b"--b\nContent-Type: application/pdf\nContent-Disposition: attachment; filename=a.pdf\n"
        b"Content-Transfer-Encoding: base64\n\nJVBERg==\n--b--\n"
    )
    ev = event(raw)
    assert ev.text == "hello there"
    assert [a.filename for a in ev.attachments] == ["a.pdf"]


def test_a_single_part_text_with_a_filename_is_the_text() -> None:
    raw = HEAD + (
        b"Content-Type: text/plain; charset=us-ascii\n"
        b'Content-Disposition: inline; filename="msg.txt"\n\nthe body\n'
    )
    ev = event(raw)
    assert ev.text == "the body\n"
    assert ev.attachments == ()


def test_html_only_mail_with_a_filename_gives_its_text() -> None:
    raw = HEAD + (
        b'Content-Type: text/html; charset=utf-8; name="index.html"\n'
        b'Content-Disposition: inline; filename="index.html"\n\n<p>Hello <b>you</b></p>\n'
    )
    ev = event(raw)
    assert ev.text.strip() == "Hello you"
    assert ev.attachments == ()


def test_a_text_part_marked_attachment_is_not_the_text() -> None:
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\n"
        b"Content-Type: text/plain\nContent-Disposition: attachment; filename=log.txt\n\nlog\n"
        b"--b\nContent-Type: text/plain\n\nthe real text\n--b--\n"
    )
    ev = event(raw)
    assert ev.text == "the real text"
    assert [(a.filename, a.size) for a in ev.attachments] == [("log.txt", 3)]


def test_alternative_prefers_plain_and_falls_back_to_html() -> None:
    alt = HEAD + (
        b"Content-Type: multipart/alternative; boundary=b\n\n--b\n"
        b"Content-Type: text/html\n\n<p>html</p>\n--b\nContent-Type: text/plain\n\nplain\n--b--\n"
    )
    assert event(alt).text == "plain"
    html_only = HEAD + (
        b"Content-Type: multipart/alternative; boundary=b\n\n--b\n"
        b"Content-Type: text/html\n\n<p>only html</p>\n--b--\n"
    )
    assert event(html_only).text.strip() == "only html"


def test_digest_parts_are_messages() -> None:
    inner = b"From: x@example.net\nSubject: First item\n\nitem one\n"
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=o\n\n--o\nContent-Type: text/plain\n\nintro\n"
        b"--o\nContent-Type: multipart/digest; boundary=d\n\n--d\n\n"
        + inner
        + b"--d\n\nFrom: y@example.net\nSubject: Second\n\nitem two\n--d--\n--o--\n"
    )
    ev = event(raw)
    assert ev.text == "intro"
    assert [(a.content_type, a.filename) for a in ev.attachments] == [
        ("message/rfc822", "First item.eml"),
        ("message/rfc822", "Second.eml"),
    ]
    assert ev.attachments[0].sha256 == sha(inner.replace(b"\n", b"\r\n").rstrip(b"\r\n"))


def test_a_boundary_that_never_occurs_keeps_the_body_as_text() -> None:
    raw = HEAD + b'Content-Type: multipart/mixed; boundary="nowhere"\n\nJust text, no parts.\n'
    assert event(raw).text == "Just text, no parts.\n"
    raw = HEAD + b"Content-Type: multipart/mixed\n\nNo boundary parameter.\n"
    assert event(raw).text == "No boundary parameter.\n"


def test_uuencoded_parts_are_decoded() -> None:
    data = bytes(range(256)) * 3
    lines = [binascii.b2a_uu(data[i : i + 45]) for i in range(0, len(data), 45)]
    body = b"begin 644 blob.bin\n" + b"".join(lines) + b"`\nend\n"
    for cte in (b"x-uuencode", b"uuencode", b"x-uue"):
        raw = HEAD + (
            b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nhi\n"
            b"--b\nContent-Type: application/octet-stream; name=blob.bin\n"
            b"Content-Transfer-Encoding: " + cte + b"\n\n" + body + b"--b--\n"
        )
        (att,) = event(raw).attachments
        assert (att.size, att.sha256) == (len(data), sha(data)), cte


def test_an_eight_bit_byte_inside_an_encoded_word_is_read_in_its_charset() -> None:
    raw = (
        b"From: =?iso-8859-1?q?Fr\xf6sche?= <f@example.org>\n"
        b"Subject: =?iso-8859-1?q?Fr\xf6sche_und_Kr=F6ten?=\n\nbody\n"
    )
    ev = event(raw)
    assert ev.subject == "Frösche und Kröten"
    assert ev.from_name == "Frösche"


def test_two_bare_addresses_are_two_mailboxes() -> None:
    mail = build(b"From: tim@powerupdev.com concierge@powerupdev.com\n\nhi\n")
    assert mail.event.from_address == "tim@powerupdev.com"
    assert mail.from_addresses == ("tim@powerupdev.com", "concierge@powerupdev.com")


def test_an_address_as_display_name_is_only_the_name() -> None:
    mail = build(b"From: alice@example.com <bob@example.com>\n\nhi\n")
    assert mail.event.from_address == "bob@example.com"
    assert mail.event.from_name == "alice@example.com"
    assert mail.from_addresses == ("bob@example.com",)


def test_a_trusted_pass_stays_authenticated_with_an_address_as_name() -> None:
    raw = (
        b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.com\n"
        b"From: alice@example.com <bob@example.com>\n\nhi\n"
    )
    mail = build(raw)
    assert mail.event.dmarc == "pass"
    assert mail.auth.authenticated


def test_unquoted_spaces_never_join_an_address() -> None:
    mail = build(b"From: John Doe jdoe@example.com\n\nhi\n")
    assert (mail.event.from_address, mail.event.from_name) == ("jdoe@example.com", "John Doe")
    # CFWS around "." and "@" is the obsolete syntax RFC 5322 §4.4 accepts.
    mail = build(b"From: john . doe @ example . com\n\nhi\n")
    assert mail.event.from_address == "john.doe@example.com"


def test_comments_are_no_display_name() -> None:
    mail = build(b"From: Pat (the boss) <pat@example.org>\n\nhi\n")
    assert mail.event.from_name == "Pat"
    mail = build(b"From: (nobody) <pat@example.org>\n\nhi\n")
    assert mail.event.from_name is None


def test_groups_quoted_local_parts_and_routes() -> None:
    assert build(b"From: Team: a@example.org, b@example.org;\n\n").from_addresses == (
        "a@example.org",
        "b@example.org",
    )
    assert build(b'From: "john doe"@example.org\n\n').event.from_address == (
        '"john doe"@example.org'
    )
    assert build(b"From: <@relay.example:pat@example.org>\n\n").event.from_address == (
        "pat@example.org"
    )


def test_damaged_message_ids_are_repaired() -> None:
    raw = (
        b"From: a@example.org\nMessage-ID: <abc@example.org\n"
        b"In-Reply-To: <old @ example.org>\n"
        b"References: <r1@example.org> (first) <r2 @example.org> <r3@example.org\n\nhi\n"
    )
    ev = event(raw)
    assert ev.message_id == "<abc@example.org>"
    assert ev.in_reply_to == "<old@example.org>"
    assert ev.references == ("<r1@example.org>", "<r2@example.org>", "<r3@example.org>")


def _many_attachments(count: int) -> bytes:
    parts = [b"--b\nContent-Type: text/plain\n\nbody\n"]
    for i in range(count):
        parts.append(b"--b\nContent-Type: application/octet-stream; name=f%d.bin\n\n%d\n" % (i, i))
    return HEAD + b"Content-Type: multipart/mixed; boundary=b\n\n" + b"".join(parts) + b"--b--\n"


def test_attachments_left_out_of_the_list_are_counted() -> None:
    ev = event(_many_attachments(1000))
    assert len(ev.attachments) == MAX_ATTACHMENTS
    assert ev.attachments_omitted == 1000 - MAX_ATTACHMENTS
    assert ev.to_json()["attachments_omitted"] == 900
    assert GatewayEvent.from_json(ev.to_json()) == ev
    whole = event(_many_attachments(3))
    assert whole.attachments_omitted == 0
    assert "attachments_omitted" not in whole.to_json()


def _tnef_attr(level: int, name: int, data: bytes) -> bytes:
    checksum = sum(data) & 0xFFFF
    return struct.pack("<BII", level, name, len(data)) + data + struct.pack("<H", checksum)


def _mapi_long_filename(name: str) -> bytes:
    text = name.encode("utf-16-le") + b"\x00\x00"
    pad = b"\x00" * (-len(text) % 4)
    # one property: PT_UNICODE (0x001F), PR_ATTACH_LONG_FILENAME (0x3707), one value
    return struct.pack("<IHHII", 1, 0x001F, 0x3707, 1, len(text)) + text + pad


def tnef(files: list[tuple[str, str, bytes]]) -> bytes:
    """A winmail.dat as Outlook writes one: per file, its rendering, title, data, MAPI."""
    out = struct.pack("<IH", 0x223E9F78, 1)
    out += _tnef_attr(1, 0x00089006, struct.pack("<I", 0x00010000))  # attTnefVersion
    for short, long, data in files:
        out += _tnef_attr(2, 0x00069002, b"\x00" * 14)  # attAttachRendData
        out += _tnef_attr(2, 0x00018010, short.encode() + b"\x00")  # attAttachTitle
        out += _tnef_attr(2, 0x0006800F, data)  # attAttachData
        out += _tnef_attr(2, 0x00069005, _mapi_long_filename(long))  # attAttachment
    return out


def test_tnef_lists_itself_then_the_files_inside() -> None:
    files = [("REPORT~1.PDF", "Quarterly report 2025.pdf", b"%PDF-1.4 x"), ("A.TXT", "a.txt", b"a")]
    blob = tnef(files)
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nsee\n"
        b'--b\nContent-Type: application/ms-tnef; name="winmail.dat"\n'
        b"Content-Transfer-Encoding: base64\n\n" + base64.encodebytes(blob) + b"--b--\n"
    )
    ev = event(raw)
    listed = [(a.filename, a.content_type, a.sha256) for a in ev.attachments]
    assert listed == [
        ("winmail.dat", "application/ms-tnef", sha(blob)),
        ("Quarterly report 2025.pdf", "application/octet-stream", sha(b"%PDF-1.4 x")),
        ("a.txt", "application/octet-stream", sha(b"a")),
    ]


def test_the_tnef_here_is_what_another_reader_reads(tmp_path: Path) -> None:
    """The hand-built TNEF above, read by the tnef program (Debian's tnef, in C)."""
    program = require_program("tnef")
    files = [("REPORT~1.PDF", "Quarterly report 2025.pdf", b"%PDF-1.4 x"), ("A.TXT", "a.txt", b"a")]
    blob = tmp_path / "winmail.dat"
    blob.write_bytes(tnef(files))
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run([program, "-C", str(out), "-f", str(blob)], check=True, timeout=30)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        "Quarterly report 2025.pdf": b"%PDF-1.4 x",
        "a.txt": b"a",
    }


def test_broken_tnef_is_listed_as_itself() -> None:
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nsee\n"
        b"--b\nContent-Type: application/ms-tnef; name=winmail.dat\n\n\x78\x9f\x3e\x22junk\n"
        b"--b--\n"
    )
    assert [a.filename for a in event(raw).attachments] == ["winmail.dat"]


def test_a_forwarded_message_is_one_attachment_named_by_its_subject() -> None:
    fwd = b"From: x@example.net\nSubject: Re: the plan\n\nquoted text\n"
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nFYI\n"
        b"--b\nContent-Type: message/rfc822\n\n" + fwd + b"--b\n"
        b"Content-Type: message/rfc822; name=orig.eml\n\n" + fwd + b"--b--\n"
    )
    ev = event(raw)
    assert ev.text == "FYI"
    assert [(a.filename, a.content_type) for a in ev.attachments] == [
        ("Re: the plan.eml", "message/rfc822"),
        ("orig.eml", "message/rfc822"),
    ]
