"""Content-Transfer-Encodings undone a piece at a time, for bytes too large to hold at once.

Each decoder is fed the encoded body in pieces of any size (:meth:`Decoder.feed`) and
answers the decoded bytes they complete; :meth:`Decoder.end` answers what is left.  The
pieces joined are exactly what :meth:`masd.core.mime.Leaf.decoded` gives for the whole
body: base64 as tolerantly (junk skipped, padding repaired at the end),
quoted-printable line by line (a line is whole before it is decoded), uuencode line by
line from its ``begin`` line on (:class:`masd.core.uu.UuDecoder`: the pieces start where
:func:`masd.core.uu.data_start` says), anything else as is.
``tests/test_message_bytes.py`` holds each against the whole-body decoding.
"""

from __future__ import annotations

import binascii
from typing import Final, Protocol

from masd.core.uu import UU_ENCODINGS, UuDecoder

__all__ = ["Decoder", "decoder_for"]

_B64_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_JUNK: Final = bytes(b for b in range(256) if b not in _B64_ALPHABET)
#: A quoted-printable line longer than this is cut where no escape can be split.
_QP_LONGEST: Final = 1 << 20


class Decoder(Protocol):
    def feed(self, data: bytes) -> bytes: ...

    def end(self) -> bytes: ...


class _Identity:
    def feed(self, data: bytes) -> bytes:
        return data

    def end(self) -> bytes:
        return b""


class _Base64:
    """As :func:`masd.core.mime.b64decode`: every byte outside the alphabet (``=``
    included) dropped, whole quadruples decoded as they fill, the tail padded."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        clean = self._carry + data.translate(None, _B64_JUNK)
        whole = len(clean) - len(clean) % 4
        self._carry = clean[whole:]
        return binascii.a2b_base64(clean[:whole]) if whole else b""

    def end(self) -> bytes:
        tail, self._carry = self._carry, b""
        if len(tail) < 2:
            return b""  # one character alone decodes to nothing
        return binascii.a2b_base64(tail + b"=" * (4 - len(tail)))


class _QuotedPrintable:
    """``binascii.a2b_qp`` of whole lines: a soft break or an escape never straddles
    two calls.  A line over :data:`_QP_LONGEST` is cut before any ``=`` near its end."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._carry + data
        cut = buf.rfind(b"\n") + 1
        if cut == 0 and len(buf) > _QP_LONGEST:
            cut = len(buf) - 3
            while cut > 0 and (b"=" in buf[cut - 2 : cut] or buf[cut - 1] == 0x0D):
                cut -= 1
        self._carry = buf[cut:]
        return binascii.a2b_qp(buf[:cut]) if cut else b""

    def end(self) -> bytes:
        tail, self._carry = self._carry, b""
        return binascii.a2b_qp(tail) if tail else b""


def decoder_for(encoding: str) -> Decoder:
    """The decoder of a part's Content-Transfer-Encoding (lowercase, as the reader keeps it)."""
    if encoding == "base64":
        return _Base64()
    if encoding == "quoted-printable":
        return _QuotedPrintable()
    if encoding in UU_ENCODINGS:
        return UuDecoder()
    return _Identity()
