"""The uuencode transfer encoding (``x-uuencode``, ``uuencode``, ``x-uue``, ``uue``).

Not in RFC 2045, but written by mail software for decades: a ``begin MODE NAME``
line, lines each starting with a length character, then ``end``.  Decoding is
tolerant, as :func:`masd.core.mime.b64decode` is: text before ``begin`` is
skipped, a line that does not decode is dropped, and a missing ``end`` ends the
data at the end of the part.  Linear in the size of the part.
"""

from __future__ import annotations

import binascii

__all__ = ["UU_ENCODINGS", "uudecode"]

UU_ENCODINGS = frozenset({"x-uuencode", "uuencode", "x-uue", "uue"})


def _line(line: bytes) -> bytes:
    try:
        return binascii.a2b_uu(line)
    except binascii.Error:
        # Some encoders drop the padding at the end of a line: the length
        # character says how many bytes the line holds.
        count = (line[0] - 32) & 63
        width = (count * 4 + 5) // 3
        try:
            return binascii.a2b_uu(line[:width].ljust(width, b" "))
        except binascii.Error:
            return b""


def uudecode(data: bytes) -> bytes:
    """The bytes of a uuencoded body; what does not decode is left out."""
    lines = data.splitlines()
    start = next((i + 1 for i, ln in enumerate(lines) if ln.startswith(b"begin ")), 0)
    out = bytearray()
    for line in lines[start:]:
        line = line.rstrip(b"\r")
        if line == b"end":
            break
        if not line or line in (b"`", b" "):
            continue
        out += _line(line)
    return bytes(out)
