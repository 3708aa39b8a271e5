"""The attachment's bytes found in the raw message and decoded a piece at a time, held
against the event reader (masd.core.event) and the whole-body decoders (masd.core.mime)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import random
from email.message import EmailMessage
from pathlib import Path

import pytest
from test_mime_cases import HEAD, tnef

from masd.core import mime, uu
from masd.core.event import build_event
from masd.core.partdecode import decoder_for
from masd.core.partspans import attachment_spans, span_bytes, streamed
from masd.core.trust import TrustSettings

MAIL = Path(__file__).parent / "mail"


def pieces(data: bytes, rng: random.Random) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        n = rng.choice((1, 2, 3, 5, 77, 1000, 65536))
        out.append(data[at : at + n])
        at += n
    return out


def decoded(encoding: str, data: bytes, rng: random.Random) -> bytes:
    decoder = decoder_for(encoding)
    return b"".join(decoder.feed(p) for p in pieces(data, rng)) + decoder.end()


@pytest.mark.parametrize("seed", range(40))
def test_base64_in_pieces_is_the_whole_body_decoding(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 5000))
    text = binascii.b2a_base64(data)
    # line breaks, junk, stray and missing padding, as mail has them
    noisy = b"\r\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    if seed % 3 == 0:
        noisy = noisy.replace(b"=", b"") + b"\r\n"
    if seed % 4 == 1:
        noisy = noisy[: rng.randrange(0, len(noisy) + 1)] + b"*&=\x00 junk"
    leaf = mime.Leaf("application/x", None, "", None, "base64", noisy)
    assert decoded("base64", noisy, rng) == leaf.decoded()


@pytest.mark.parametrize("seed", range(40))
def test_quoted_printable_in_pieces_is_the_whole_body_decoding(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = b"ab=\r\n \t3D=\n=0A=FF=zzA"
    body = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 3000)))
    leaf = mime.Leaf("text/plain", None, "", None, "quoted-printable", body)
    assert decoded("quoted-printable", body, rng) == leaf.decoded()


def test_a_quoted_printable_line_longer_than_the_bound_is_cut_between_escapes() -> None:
    body = (b"x=3D" * 400_000) + b"=\r\nend"
    rng = random.Random(1)
    leaf = mime.Leaf("text/plain", None, "", None, "quoted-printable", body)
    assert decoded("quoted-printable", body, rng) == leaf.decoded()


def uudecoded_line_by_line(data: bytes) -> bytes:
    """The whole-body uudecode masd had before it decoded in pieces: the reference."""
    lines = data.splitlines()
    start = next((i + 1 for i, ln in enumerate(lines) if ln.startswith(b"begin ")), 0)
    out = bytearray()
    for line in lines[start:]:
        line = line.rstrip(b"\r")
        if line == b"end":
            break
        if not line or line in (b"`", b" "):
            continue
        out += uu._line(line)
    return bytes(out)


@pytest.mark.parametrize("seed", range(60))
def test_uuencode_in_pieces_is_the_line_by_line_decoding(seed: int) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(rng.randrange(0, 4000))
    lines = [binascii.b2a_uu(data[i : i + 45]) for i in range(0, len(data), 45)]
    if seed % 2:  # padding dropped at the ends of lines, as some encoders write
        lines = [ln.rstrip(b"\n").rstrip(b"`") + b"\n" for ln in lines]
    if seed % 3 == 0:  # junk lines, an overlong line, a bare CR, text after end
        at = rng.randrange(0, len(lines) + 1)
        long = b"M" + b"!" * rng.randrange(60, 200_000) + b"\n"  # decodes: its start counts
        lines[at:at] = [b"not uu at all\n", long, b"\r", b"M" + b"x" * 70 + b"\n"]
    body = b"".join(lines) + b"`\nend\n" + lines[0] if lines else b"end\n"
    if seed % 5 == 1:
        body = body[: rng.randrange(0, len(body) + 1)]  # cut anywhere, the end line too
    breaks = (b"\n", b"\r\n", b"\r")[seed % 3]
    intro = (b"", b"Some text first.\r\n", b"begin 644 a.bin\n")[seed % 4 % 3]
    body = intro + (b"begin 644 f.bin\n" if seed % 7 else b"") + body.replace(b"\n", breaks)
    expected = uudecoded_line_by_line(body)
    assert uu.uudecode(body) == expected
    start = uu.data_start(body)
    assert decoded("x-uuencode", body[start:], rng) == expected
    if seed % 7 and seed % 5 != 1 and seed % 3:
        assert expected == data


def test_other_encodings_are_passed_through() -> None:
    assert decoded("8bit", b"a\r\nb", random.Random(0)) == b"a\r\nb"
    assert decoded("x-unknown", b"=41", random.Random(0)) == b"=41"


def spans_match_event(raw: bytes) -> int:
    """Each span decodes to the attachment the event lists; how many there were."""
    event = build_event(
        raw,
        mail_from="a@example.org",
        rcpt_to="t@help.example",
        received_at="2026-12-01T00:00:00Z",
        message_ref="msg-1",
        trust=TrustSettings(frozenset({"mx.help.example"}), frozenset()),
    ).event
    spans = attachment_spans(raw)
    assert len(spans) == len(event.attachments)
    for span, listed in zip(spans, event.attachments, strict=True):
        if span.streamable:
            fed = streamed(raw, span)
            data = decoded(span.encoding, raw[fed.start : fed.end], random.Random(0))
        else:
            data = span_bytes(raw[span.start : span.end], span)
        assert (len(data), hashlib.sha256(data).hexdigest()) == (listed.size, listed.sha256)
        assert (span.content_type, span.filename) == (listed.content_type, listed.filename)
    return len(spans)


def test_every_attachment_of_the_mail_corpus_is_found_where_the_event_reader_found_it() -> None:
    files = sorted(MAIL.rglob("*.eml"))
    assert files
    found = sum(spans_match_event(p.read_bytes()) for p in files)
    assert found > 0


def test_nested_multiparts_with_every_encoding() -> None:
    msg = EmailMessage()
    msg["From"] = "a@example.org"
    msg["Subject"] = "files"
    msg.set_content("text\n")
    msg.add_alternative("<p>text</p>", subtype="html")
    rng = random.Random(5)
    msg.add_attachment(rng.randbytes(10_000), maintype="image", subtype="png", filename="p.png")
    msg.add_attachment("é=\n" * 300, subtype="plain", filename="n.txt", cte="quoted-printable")
    msg.add_attachment(b"raw\r\nbytes", maintype="application", subtype="x", cte="8bit")
    inner = EmailMessage()
    inner["Subject"] = "fwd"
    inner.set_content("forwarded\n")
    msg.add_attachment(inner)
    raw = msg.as_bytes().replace(b"\n", b"\r\n")
    assert spans_match_event(raw) == 4
    assert spans_match_event(b"From x@y Mon Jan 1\n" + raw) == 4


def test_files_inside_a_tnef_part_are_decoded_whole_and_uuencoded_bodies_in_pieces() -> None:
    files = [("REPORT~1.PDF", "Quarterly report 2025.pdf", b"%PDF-1.4 x"), ("A.TXT", "a.txt", b"a")]
    uu_line = binascii.b2a_uu(b"uuencoded bytes")
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nsee\n"
        b'--b\nContent-Type: application/ms-tnef; name="winmail.dat"\n'
        b"Content-Transfer-Encoding: base64\n\n" + base64.encodebytes(tnef(files)) + b"--b\n"
        b"Content-Type: application/octet-stream; name=u.bin\n"
        b"Content-Transfer-Encoding: x-uuencode\n\nbegin 644 u.bin\n" + uu_line + b"`\nend\n--b--\n"
    )
    assert spans_match_event(raw) == 4
    spans = attachment_spans(raw)
    assert [(s.streamable, s.inner) for s in spans] == [
        (True, None),
        (False, 0),
        (False, 1),
        (True, None),
    ]
    assert span_bytes(raw[spans[3].start : spans[3].end], spans[3]) == b"uuencoded bytes"
    fed = streamed(raw, spans[3])
    assert raw[fed.start : fed.end].startswith(b"\n" + uu_line[:10])
