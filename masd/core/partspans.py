"""Where each attachment of a message lies in its raw bytes, without copying them.

:func:`attachment_spans` is the one place the bytes behind ``event.attachments[n]`` are
found: for each listed attachment, in the event's order, the offsets of its encoded body
in the raw message and its transfer encoding.  It walks the message as the event reader
(:func:`masd.core.mime.leaves`, :func:`masd.core.event.build_event`) does (the same
defaults, the same delimiter lines, the same choice of the text part and of what is an
attachment), keeping offsets where the reader keeps copies, so a large attachment is
never held twice.  The bytes it points at are checked against the event's ``sha256``
before they are served (:mod:`masd.read.message_bytes`), so a walk that ever parted from
the reader's would be refused, never served wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Final, NamedTuple

from masd.core.comments import strip_comments
from masd.core.event import MAX_ATTACHMENTS
from masd.core.mime import (
    MAX_CONTENT_TYPE,
    MAX_FILENAME,
    MAX_MIME_DEPTH,
    MAX_PARTS,
    cap,
    decode_words,
    first_of,
    one_line,
    params,
    split_entity,
)

__all__ = ["PartSpan", "attachment_spans"]

#: The first window a part's headers are looked for in; doubled until they end in it.
_HEAD_WINDOW: Final = 64 * 1024
_NO_PARAMS: Final[Mapping[str, str]] = {}
_DELIMITER_TAIL: Final = re.compile(rb"(--)?[ \t]*\r?(?=\n|\Z)")


class PartSpan(NamedTuple):
    """One leaf: its type, how it is marked, and ``raw[start:end]``, its encoded body."""

    content_type: str
    disposition: str
    filename: str | None
    encoding: str
    start: int
    end: int

    @property
    def attachment_like(self) -> bool:
        return self.disposition == "attachment" or self.filename is not None


def attachment_spans(raw: bytes) -> list[PartSpan]:
    """The leaf of each attachment the event lists, in its order."""
    found = list(_leaves(raw))
    body: PartSpan | None = None
    html: PartSpan | None = None
    for leaf in found:
        if leaf.attachment_like:
            continue
        if leaf.content_type == "text/plain":
            body = leaf
            break
        if leaf.content_type == "text/html" and html is None:
            html = leaf
    body = body or html
    listed = [
        leaf
        for leaf in found
        if leaf is not body and (leaf.attachment_like or not leaf.content_type.startswith("text/"))
    ]
    return listed[:MAX_ATTACHMENTS]


def _entity_at(raw: bytes, lo: int, hi: int) -> tuple[dict[str, str], int]:
    """The first values of the headers of ``raw[lo:hi]`` and where its body starts."""
    size = _HEAD_WINDOW
    while True:
        window = raw[lo : min(hi, lo + size)]
        headers, body = split_entity(window)
        start = len(window) - len(body)
        if lo + size >= hi or window.find(b"\n", start) >= 0:
            return first_of(headers), lo + start
        size *= 2


def _leaves(raw: bytes) -> Iterator[PartSpan]:
    """:func:`masd.core.mime.leaves` of the whole message, as spans."""
    top, body = _entity_at(raw, 0, len(raw))
    stack: list[tuple[Mapping[str, str], int, int, int]] = [(top, body, len(raw), 0)]
    count = 0
    while stack and count < MAX_PARTS:
        hdrs, lo, hi, depth = stack.pop()
        ctype_raw = hdrs.get("content-type")
        ctype, cparams = params(ctype_raw) if ctype_raw else ("text/plain", _NO_PARAMS)
        if "/" not in ctype or len(ctype) > MAX_CONTENT_TYPE or not ctype.isascii():
            ctype, cparams = "text/plain", _NO_PARAMS
        boundary = cparams.get("boundary", "")
        if ctype.startswith("multipart/"):
            if not boundary:
                ctype = "text/plain"
            elif depth < MAX_MIME_DEPTH:
                for part_lo, part_hi in reversed(_parts(raw, boundary, lo, hi)):
                    part_headers, part_body = _entity_at(raw, part_lo, part_hi)
                    stack.append((part_headers, part_body, part_hi, depth + 1))
                continue
        count += 1
        yield _span(hdrs, ctype, cparams, lo, hi)


def _span(
    hdrs: Mapping[str, str], ctype: str, cparams: Mapping[str, str], lo: int, hi: int
) -> PartSpan:
    disp_raw = hdrs.get("content-disposition")
    disposition, dparams = params(disp_raw) if disp_raw else ("", _NO_PARAMS)
    filename = dparams.get("filename") or cparams.get("name")
    if filename is not None:
        filename = cap(one_line(decode_words(filename)), MAX_FILENAME) or None
    cte = hdrs.get("content-transfer-encoding")
    encoding = strip_comments(cte).strip().lower() if cte else ""
    return PartSpan(ctype, disposition, filename, encoding, lo, hi)


def _delimiters(raw: bytes, boundary: str, lo: int, hi: int) -> Iterator[tuple[int, int, bool]]:
    """(start, end, closes) of each delimiter line in ``raw[lo:hi]``, as the reader finds them."""
    needle = b"--" + boundary.encode("utf-8", "replace")
    pos = lo
    while True:
        start = raw.find(needle, pos, hi)
        if start < 0:
            return
        at_line = start == lo or raw[start - 1] == 0x0A
        m = _DELIMITER_TAIL.match(raw, start + len(needle), hi) if at_line else None
        if m is None:
            pos = start + 1
            continue
        yield start, m.end(), m.group(1) is not None
        pos = m.end()


def _parts(raw: bytes, boundary: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """:func:`masd.core.mime.split_multipart` of ``raw[lo:hi]``, as offsets."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for found, found_end, closes in _delimiters(raw, boundary, lo, hi):
        if start is not None:
            end = found
            # The line break before a delimiter belongs to the delimiter.
            if end > start and raw[end - 1] == 0x0A:
                end -= 2 if end - 1 > start and raw[end - 2] == 0x0D else 1
            spans.append((start, end))
            if len(spans) >= MAX_PARTS:
                return spans
        if closes:
            return spans
        nl = raw.find(b"\n", found_end, hi)
        start = hi if nl < 0 else nl + 1
    if start is not None and start <= hi:
        spans.append((start, hi))
    return spans
