"""The uuencode transfer encoding (``x-uuencode``, ``uuencode``, ``x-uue``, ``uue``).

Not in RFC 2045, but written by mail software for decades: a ``begin MODE NAME``
line, lines each starting with a length character, then ``end``.  Decoding is
tolerant, as :func:`masd.core.mime.b64decode` is: text before ``begin`` is
skipped, a line that does not decode is dropped, and a missing ``end`` ends the
data at the end of the part.  Linear in the size of the part.

:class:`UuDecoder` decodes a piece at a time, from where :func:`data_start` says the
lines start; :func:`uudecode` is the same over a whole body, so an attachment served a
piece at a time (:mod:`masd.core.partdecode`) has the bytes its event lists.
"""

from __future__ import annotations

import binascii
import re
from typing import Final

__all__ = ["UU_ENCODINGS", "UuDecoder", "data_start", "uudecode"]

UU_ENCODINGS = frozenset({"x-uuencode", "uuencode", "x-uue", "uue"})

#: A line's bytes that can change what it decodes to: its length character and at most 63
#: bytes in 84 characters; the rest of a longer line is never looked at.
_KEPT: Final = 128
#: The whole body is decoded in pieces of this size (no copy of its lines at once).
_PIECE: Final = 256 * 1024
_BEGIN_LINE: Final = re.compile(rb"[\r\n]begin ")
_BREAK: Final = re.compile(rb"[\r\n]")


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


def data_start(body: bytes | memoryview, start: int = 0, end: int | None = None) -> int:
    """Where the encoded lines of ``body[start:end]`` start: at the line break that ends
    its first ``begin`` line; ``start`` itself when it has none (every line is decoded)."""
    data = bytes(body) if isinstance(body, memoryview) else body
    end = len(data) if end is None else end
    if data.startswith(b"begin ", start, end):
        at = start
    elif (found := _BEGIN_LINE.search(data, start, end)) is not None:
        at = found.start() + 1
    else:
        return start
    line_end = _BREAK.search(data, at, end)
    return end if line_end is None else line_end.start()


class UuDecoder:
    """uudecode fed the lines after ``begin`` in pieces of any size: a line is decoded once
    it is whole, ``end`` ends the data, and only the first :data:`_KEPT` bytes of a line
    are held however long it is."""

    def __init__(self) -> None:
        self._carry = b""
        self._ended = False

    def _decode(self, lines: list[bytes]) -> bytes:
        out = bytearray()
        for line in lines:
            if line == b"end":
                self._ended = True
                break
            if line and line not in (b"`", b" "):
                out += _line(line)
        return bytes(out)

    def feed(self, data: bytes) -> bytes:
        if self._ended:
            return b""
        lines = _BREAK.split(self._carry + data)
        tail = lines.pop()
        self._carry = tail[:_KEPT]
        return self._decode(lines)

    def end(self) -> bytes:
        tail, self._carry = self._carry, b""
        return b"" if self._ended else self._decode([tail])


def uudecode(data: bytes) -> bytes:
    """The bytes of a uuencoded body; what does not decode is left out."""
    decoder = UuDecoder()
    out = bytearray()
    view = memoryview(data)
    for at in range(data_start(data), len(data), _PIECE):
        out += decoder.feed(bytes(view[at : at + _PIECE]))
    return bytes(out + decoder.end())
