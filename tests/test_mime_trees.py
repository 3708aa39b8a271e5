"""Generated MIME trees: the text and every attachment's bytes survive masd's reading.

Hypothesis builds nested multiparts whose leaves are text or binary, each in
one of the transfer encodings masd decodes (base64, quoted-printable, 7bit,
8bit, uuencode), some with filenames (plain, quoted or RFC 2231 encoded, some
split into continuations); the message is written out here, byte by byte, and
the event must hold the first text/plain part not marked attachment as its
text and every other part's bytes (as size and sha256) in document order.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
from dataclasses import dataclass
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masd.core.event import build_event
from masd.core.trust import TrustSettings

TRUST = TrustSettings.of(["mx.help.example"])
_counter = itertools.count()


@dataclass(frozen=True)
class Leaf:
    ctype: str
    data: bytes
    encoding: str
    filename: str | None
    name_form: str
    disposition: str


@dataclass(frozen=True)
class Multi:
    subtype: str
    children: tuple[Leaf | Multi, ...]


_TEXT = st.text(st.sampled_from("abc xyz.,-\n\t\u00e9\u20ac\u65e5"), max_size=200).map(
    lambda t: t.replace("\n", "\r\n")
)
_NAMES = (
    st.text(st.sampled_from("abcXYZ019 ._-()\u00e9\u00fc\u65e5\u20ac'"), min_size=1, max_size=90)
    .map(str.strip)
    .filter(bool)
)


@st.composite
def leaves(draw: st.DrawFn) -> Leaf:
    if draw(st.booleans()):
        data = draw(_TEXT).encode()
        ctype = "text/plain"
        encodings = ["base64", "quoted-printable", "8bit"] + (["7bit"] if data.isascii() else [])
    else:
        data = draw(st.binary(max_size=600))
        ctype = draw(st.sampled_from(["application/octet-stream", "image/png"]))
        encodings = ["base64", "quoted-printable", "x-uuencode", "uuencode", "x-uue"]
    name = draw(st.none() | _NAMES)
    form = draw(st.sampled_from(["rfc2231", "rfc2231-split", "quoted"]))
    if name is not None and not name.isascii() and form == "quoted":
        form = "rfc2231"
    disposition = draw(st.sampled_from(["", "inline", "attachment"]))
    return Leaf(ctype, data, draw(st.sampled_from(encodings)), name, form, disposition)


trees = st.recursive(
    leaves(),
    lambda kids: st.builds(
        Multi,
        st.sampled_from(["mixed", "alternative", "related"]),
        st.lists(kids, min_size=1, max_size=4).map(tuple),
    ),
    max_leaves=12,
)


def _crlf(data: bytes) -> bytes:
    return re.sub(rb"(?<!\r)\n", b"\r\n", data)


def _encode(leaf: Leaf) -> bytes:
    if leaf.encoding == "base64":
        return _crlf(base64.encodebytes(leaf.data))
    if leaf.encoding == "quoted-printable":
        istext = leaf.ctype.startswith("text/")
        return _crlf(binascii.b2a_qp(leaf.data, istext=istext, header=False))
    if leaf.encoding in ("x-uuencode", "uuencode", "x-uue"):
        lines = [binascii.b2a_uu(leaf.data[i : i + 45]) for i in range(0, len(leaf.data), 45)]
        return _crlf(b"begin 644 f\n" + b"".join(lines) + b"`\nend\n")
    return leaf.data


def _name_params(leaf: Leaf) -> tuple[str, str]:
    """(Content-Type parameter, Content-Disposition parameter) naming the part."""
    name = leaf.filename
    if name is None:
        return "", ""
    if leaf.name_form == "quoted":
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'; name="{escaped}"', f'; filename="{escaped}"'
    encoded = quote(name.encode(), safe="")
    if leaf.name_form == "rfc2231":
        return "", f"; filename*=utf-8''{encoded}"
    # Sections cut between escapes: a "%XX" is never split across two of them.
    units = re.findall(r"%[0-9A-F]{2}|.", encoded)
    sections = ["".join(units[i : i + 8]) for i in range(0, len(units), 8)]
    params = [f"; filename*0*=utf-8''{sections[0]}"]
    params += [f";\r\n filename*{i}*={s}" for i, s in enumerate(sections[1:], 1)]
    return "", "".join(params)


def _write(node: Leaf | Multi) -> bytes:
    if isinstance(node, Multi):
        boundary = f"=_b{next(_counter)}_x7Q"
        out = [f'Content-Type: multipart/{node.subtype}; boundary="{boundary}"\r\n\r\n'.encode()]
        out.append(b"preamble\r\n")
        for child in node.children:
            out.append(f"--{boundary}\r\n".encode() + _write(child) + b"\r\n")
        out.append(f"--{boundary}--\r\n".encode())
        return b"".join(out)
    ctype_param, disp_param = _name_params(leaf=node)
    charset = "; charset=utf-8" if node.ctype.startswith("text/") else ""
    head = f"Content-Type: {node.ctype}{charset}{ctype_param}\r\n"
    if node.disposition or disp_param:
        head += f"Content-Disposition: {node.disposition or 'inline'}{disp_param}\r\n"
    head += f"Content-Transfer-Encoding: {node.encoding}\r\n\r\n"
    return head.encode() + _encode(node)


def _flat(node: Leaf | Multi) -> list[Leaf]:
    if isinstance(node, Leaf):
        return [node]
    return [leaf for child in node.children for leaf in _flat(child)]


def _disposition(leaf: Leaf) -> str:
    return leaf.disposition or ("inline" if leaf.filename else "")


def _expected(tree: Leaf | Multi) -> tuple[str, list[tuple[str | None, int, str]]]:
    flat = _flat(tree)
    body = next(
        (p for p in flat if p.ctype == "text/plain" and _disposition(p) != "attachment"), None
    )
    text = body.data.decode().replace("\r\n", "\n") if body is not None else ""
    listed = [
        (p.filename, len(p.data), hashlib.sha256(p.data).hexdigest())
        for p in flat
        if p is not body
        and (_disposition(p) == "attachment" or p.filename or not p.ctype.startswith("text/"))
    ]
    return text, listed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_text_and_attachments_survive(tree: Leaf | Multi) -> None:
    raw = (
        b"From: Pat <pat@example.org>\r\nTo: ticket@help.example\r\nSubject: t\r\n"
        b"MIME-Version: 1.0\r\n" + _write(tree)
    )
    event = build_event(
        raw,
        mail_from="pat@example.org",
        rcpt_to="ticket@help.example",
        received_at="2025-01-06T10:00:05Z",
        message_ref="m-1",
        trust=TRUST,
    ).event
    text, listed = _expected(tree)
    assert event.text == text
    got = [(a.filename, a.size, a.sha256) for a in event.attachments]
    assert got == listed
