"""The MIME reader behind the gateway event: headers, charsets, parameters, parts.

Written for the LMTP hot path (thousands of small messages a second) instead
of ``email.policy`` header objects: headers are split and unfolded once,
multipart bodies are cut on their delimiter lines with no regex compiled per
boundary, so the cost is linear in the size of the message times the nesting
depth (at most :data:`MAX_MIME_DEPTH`).  The raw bytes are only read, never
changed, and nothing here refuses mail: malformed MIME, unknown charsets and
8-bit headers give empty or replaced text (U+FFFD), never an error.

Where a fast path answers for the common form (:func:`split_simple`, the
cached :func:`params`), it answers exactly as the general code would;
``tests/test_event_fast.py`` holds the two against each other.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from masd.core.comments import strip_comments
from masd.core.decoding import b64decode, decode, scrub
from masd.core.uu import UU_ENCODINGS, uudecode

__all__ = [
    "MAX_CONTENT_TYPE",
    "MAX_FILENAME",
    "MAX_MIME_DEPTH",
    "MAX_PARTS",
    "Leaf",
    "b64decode",
    "cap",
    "cap_utf8",
    "decode",
    "decode_words",
    "entity_at",
    "first_of",
    "leaves",
    "lf",
    "multipart_spans",
    "one_line",
    "params",
    "parse_headers",
    "read_params",
    "split_entity",
    "split_lines",
    "split_multipart",
    "split_simple",
]

MAX_FILENAME = 255  # an attachment's filename (the event's attachments[].filename)
MAX_CONTENT_TYPE = 255  # RFC 6838 §4.2: type and subtype of 127 each
#: Multipart entities nested deeper than this are not opened: the entity at
#: the limit is listed as one attachment.  Real mail nests a handful of levels
#: (mixed > alternative > related); the limit bounds the work on hostile mail.
MAX_MIME_DEPTH = 16
#: Leaf parts looked at; later ones are ignored (the raw message keeps them).
#: Far above the event's list of attachments, so the parts it leaves out are
#: counted, not lost unseen.
MAX_PARTS = 10000


# ---------------------------------------------------------------------------
# RFC 2047 encoded words

_ENCODED_WORD = re.compile(r"=\?([^?\s]+)\?([bBqQ])\?([^?\s]*)\?=")


def decode_words(value: str) -> str:
    """Decode RFC 2047 encoded words; undecodable words keep their text.

    Whitespace between two adjacent encoded words is dropped (RFC 2047 §6.2),
    and adjacent words in the same charset are decoded together, so a
    multi-byte character split across two words comes out whole.
    """
    if "=?" not in value:
        return value
    out: list[str] = []
    pending = bytearray()
    pending_cs = ""
    pos = 0
    after_word = False
    for m in _ENCODED_WORD.finditer(value):
        gap = value[pos : m.start()]
        joined = after_word and not gap.strip(" \t")
        charset = m.group(1).split("*", 1)[0].lower()
        if pending and (not joined or charset != pending_cs):
            out.append(decode(bytes(pending), pending_cs))
            pending.clear()
        if not joined:
            out.append(gap)
        raw = m.group(3).encode("utf-8", "surrogateescape")
        if m.group(2) in "bB":
            pending += b64decode(raw)
        else:
            pending += binascii.a2b_qp(raw, header=True)
        pending_cs = charset
        pos = m.end()
        after_word = True
    if pending:
        out.append(decode(bytes(pending), pending_cs))
    out.append(value[pos:])
    return "".join(out)


# ---------------------------------------------------------------------------
# Headers

_HEADER_NAME = re.compile(rb"([\x21-\x39\x3b-\x7e]+)[ \t]*:")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]+")


# An encoded word as bytes, its text possibly holding raw 8-bit bytes.
_ENCODED_WORD_BYTES = re.compile(rb"=\?([^?\s]+)\?([bBqQ])\?([^?\s]*)\?=")
_EIGHT_BIT = re.compile(rb"[\x80-\xff]")


def _word_bytes(m: re.Match[bytes]) -> bytes:
    """An encoded word with its raw 8-bit bytes written as Q escapes of themselves.

    Software that writes 8-bit text into a Q word means the bytes in the
    word's charset, which is what ``=XX`` says; in a B word they are not
    base64 and are dropped (as b64decode would)."""
    text = m.group(3)
    if m.group(2) in b"qQ":
        text = _EIGHT_BIT.sub(lambda b: b"=%02X" % b.group()[0], text)
    else:
        text = _EIGHT_BIT.sub(b"", text)
    return b"=?" + m.group(1) + b"?" + m.group(2) + b"?" + text + b"?="


def _header_text(raw: bytes) -> str:
    if raw.isascii():
        return raw.decode("ascii")
    if b"=?" in raw:
        # Encoded words are decoded from bytes: an 8-bit byte inside one
        # belongs to the word's charset, not to the UTF-8 guess below.
        raw = _ENCODED_WORD_BYTES.sub(_word_bytes, raw)
        if raw.isascii():
            return raw.decode("ascii")
    # RFC 6532 allows UTF-8 in headers; other 8-bit bytes are a guess at best.
    return scrub(raw.decode("utf-8", "replace"))


Headers = list[tuple[str, str]]


def split_entity(data: bytes) -> tuple[Headers, bytes]:
    """(headers, body) of one entity: names as written, values unfolded.

    Headers end at the first empty line.  A line that is neither a header nor
    a continuation starts the body (as the stdlib parser does), and an mbox
    ``From `` line at the very top is skipped.
    """
    headers, body = entity_at(data, 0, len(data))
    return headers, data[body:]


def entity_at(data: bytes, start: int, end: int) -> tuple[Headers, int]:
    """``split_entity`` of ``data[start:end]`` without copying it: the body's offset."""
    if data.startswith(b"From ", start, end):
        nl = data.find(b"\n", start, end)
        start = nl + 1 if nl >= 0 else end
    simple = _simple_at(data, start, end)
    if simple is not None:
        return simple
    return _lines_at(data, start, end)


# The end of a header block: the line break before the first empty line.
_BLOCK_END = re.compile(rb"\n\r?\n")
# A CR that does not end a line.
_LONE_CR = re.compile(r"\r(?!\n)")
# One line of a decoded header block with its line breaks as LF only: a
# header field (name, then its value up to the end of its last continuation
# line, the inner LFs still in it), or else (group 3) any other line.
_FIELD = re.compile(r"([\x21-\x39\x3b-\x7e]+)[ \t]*:([^\n]*(?:\n[ \t][^\n]*)*)\n|([^\n]*\n)")


def split_simple(data: bytes) -> tuple[Headers, bytes] | None:
    """``split_lines`` for the common entity, in a few C-level passes; else None.

    It answers only when the headers end at an empty line, every line above
    it is a header or a continuation, the block is valid UTF-8 (ASCII
    included) and every CR in it ends a line.  Then it reads the same
    fields: ``split_lines`` drops one CR at the end of each line, here all
    CRs go at once (each one ends a line); ``_FIELD`` takes exactly the
    lines ``split_lines`` joins into one field (a name line as
    ``_HEADER_NAME`` reads it, then the lines starting with SP or HTAB); the
    line breaks are dropped and SP/HTAB stripped as in ``_header_pair``.
    Decoding the whole block at once equals decoding each value, since valid
    UTF-8 cut at ASCII line breaks stays valid (and ``_scrub`` has nothing to
    do).  None (no empty line, a line that is not a header, 8-bit or
    malformed headers, a lone CR) means "ask ``split_lines``".
    """
    found = _simple_at(data, 0, len(data))
    return None if found is None else (found[0], data[found[1] :])


def _simple_at(data: bytes, start: int, stop: int) -> tuple[Headers, int] | None:
    end = _BLOCK_END.search(data, start, stop)
    if end is None:
        return None
    try:
        text = data[start : end.start() + 1].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\r" in text:
        if _LONE_CR.search(text) is not None:
            return None
        text = text.replace("\r", "")
    headers: list[tuple[str, str]] = []
    for name, value, other in _FIELD.findall(text):
        if other:
            return None  # not a header: split_lines starts the body early
        if "\n" in value:
            value = value.replace("\n", "")
        headers.append((name, value.strip(" \t")))
    return headers, end.end()


def split_lines(data: bytes) -> tuple[Headers, bytes]:
    """``split_entity`` line by line, for any bytes at all."""
    headers, body = _lines_at(data, 0, len(data))
    return headers, data[body:]


def _lines_at(data: bytes, pos: int, n: int) -> tuple[Headers, int]:
    headers: Headers = []
    name = b""
    parts: list[bytes] = []
    while pos < n:
        nl = data.find(b"\n", pos, n)
        end = n if nl < 0 else nl
        nxt = n if nl < 0 else nl + 1
        line = data[pos:end]
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            pos = nxt
            break
        if line[0] in b" \t" and name:
            parts.append(line)
        else:
            m = _HEADER_NAME.match(line)
            if m is None:
                break  # not a header: the body starts on this line
            if name:
                headers.append(_header_pair(name, parts))
            name = m.group(1)
            parts = [line[m.end() :]]
        pos = nxt
    if name:
        headers.append(_header_pair(name, parts))
    return headers, pos


def _header_pair(name: bytes, parts: list[bytes]) -> tuple[str, str]:
    value = _header_text(b"".join(parts)).strip(" \t")
    return name.decode("ascii"), value


def parse_headers(raw: bytes) -> list[tuple[str, str]]:
    """The top-level headers of a message: (name, unfolded value), in order."""
    return split_entity(raw)[0]


def one_line(value: str) -> str:
    """A header-derived field: no CR, LF, NUL or other control characters."""
    if value.isprintable():  # no Cc character at all, so nothing to replace
        return value.strip()
    return _CONTROL.sub(" ", value).strip()


def cap(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit]


# ---------------------------------------------------------------------------
# MIME parameters (RFC 2045 §5.1, RFC 2231)

_PARAM = re.compile(r';\s*([^\s=;"]+)\s*=\s*("(?:[^"\\]|\\.)*"?|[^;]*)')
_SECTION = re.compile(r"([^*]+)(?:\*(\d{1,3}))?(\*)?")
_QUOTED_PAIR = re.compile(r"\\(.)")


def params(value: str) -> tuple[str, Mapping[str, str]]:
    """(lowercase main value, parameters) of Content-Type / Content-Disposition.

    Short values are cached (``text/plain; charset=utf-8`` repeats from
    message to message): the answer depends on the value alone, and callers
    only read the mapping.
    """
    if len(value) <= 256:
        return _params_cached(value)
    return read_params(value)


@lru_cache(maxsize=1024)
def _params_cached(value: str) -> tuple[str, Mapping[str, str]]:
    return read_params(value)


def read_params(value: str) -> tuple[str, Mapping[str, str]]:
    """``params`` uncached.

    RFC 2231 extended parameters (``name*=charset'lang'%xx``) and
    continuations (``name*0``, ``name*1*``) are joined and decoded; an
    extended value wins over a plain one of the same name.
    """
    text = strip_comments(value) if "(" in value else value
    semi = text.find(";")
    main = (text if semi < 0 else text[:semi]).strip().lower()
    params: dict[str, str] = {}
    if semi < 0:
        return main, params
    sections: dict[str, dict[int, tuple[str, bool]]] = {}
    for m in _PARAM.finditer(text, semi):
        key, val = m.group(1).lower(), m.group(2).strip()
        if val.startswith('"'):
            val = val[1:-1] if len(val) > 1 and val.endswith('"') else val[1:]
            val = _QUOTED_PAIR.sub(r"\1", val)
        s = _SECTION.fullmatch(key)
        if s is None or (s.group(2) is None and s.group(3) is None):
            params.setdefault(key, val)
            continue
        number = int(s.group(2) or 0)
        sections.setdefault(s.group(1), {}).setdefault(number, (val, s.group(3) is not None))
    for base, pieces in sections.items():
        charset = "utf-8"
        data = bytearray()
        for i, number in enumerate(sorted(pieces)):
            val, encoded = pieces[number]
            if encoded:
                if i == 0 and val.count("'") >= 2:
                    charset, _lang, val = val.split("'", 2)
                data += unquote_to_bytes(val)
            else:
                data += val.encode("utf-8")
        params[base] = decode(bytes(data), charset or "utf-8")
    return main, params


# ---------------------------------------------------------------------------
# MIME structure


class Leaf(NamedTuple):
    """One leaf part (a tuple: built once per part on the hot path)."""

    content_type: str
    charset: str | None
    disposition: str
    filename: str | None
    encoding: str
    #: the part's body as it stands in the message (a view, not a copy)
    body: memoryview
    #: where that body lies in the message: ``data[start:end]``
    start: int = 0
    end: int = 0

    def decoded(self) -> bytes:
        if self.encoding == "base64":
            return b64decode(self.body)
        if self.encoding == "quoted-printable":
            return binascii.a2b_qp(self.body)
        if self.encoding in UU_ENCODINGS:
            return uudecode(bytes(self.body))
        return bytes(self.body)

    @property
    def is_attachment(self) -> bool:
        """Marked ``Content-Disposition: attachment`` (a filename alone is not)."""
        return self.disposition == "attachment"


def first_of(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each lowercase header name's first value (what a top-down search finds)."""
    first: dict[str, str] = {}
    for name, value in headers:
        first.setdefault(name.lower(), value)
    return first


_NO_PARAMS: Mapping[str, str] = {}


def leaves(first: Mapping[str, str], data: bytes, start: int = 0) -> Iterator[Leaf]:
    """The leaf parts of the message body ``data[start:]`` in document order.

    RFC 2045 §5.2: a missing or unparseable Content-Type means text/plain;
    inside multipart/digest the default is message/rfc822 (RFC 2046
    §5.1.5).  A multipart without a boundary parameter, or whose boundary
    never occurs, is all preamble: it is read as text/plain, nothing of it
    lost (one with only whitespace in it has nothing to read).  message/*
    parts are leaves: an attached message is one attachment, and its own
    parts are never mistaken for the body.  A missing close delimiter ends
    the last part at the end of the entity (RFC 2046 §5.1.1 asks for one;
    mail without it is common enough).

    Parts are offsets into ``data``, never copies: a leaf's body is a
    memoryview of it, so a large attachment is held once.
    """
    # ``first`` is the entity's first_of map, built once per entity.
    Span = tuple[Mapping[str, str], int, int, int, str]
    stack: list[Span] = [(first, start, len(data), 0, "text/plain")]
    view = memoryview(data)
    count = 0
    while stack and count < MAX_PARTS:
        hdrs, lo, hi, depth, default = stack.pop()
        ctype_raw = hdrs.get("content-type")
        ctype, cparams = params(ctype_raw) if ctype_raw else (default, _NO_PARAMS)
        if "/" not in ctype or len(ctype) > MAX_CONTENT_TYPE or not ctype.isascii():
            ctype, cparams = default, _NO_PARAMS
        if ctype.startswith("multipart/"):
            spans = multipart_spans(data, cparams.get("boundary", ""), lo, hi)
            if not spans:
                if _BLANK.fullmatch(data, lo, hi):
                    continue  # nothing: an inner multipart that reused its parent's boundary
                ctype = "text/plain"  # all preamble
            elif depth < MAX_MIME_DEPTH:
                inner = "message/rfc822" if ctype == "multipart/digest" else "text/plain"
                for part_lo, part_hi in reversed(spans):
                    part_headers, body = entity_at(data, part_lo, part_hi)
                    stack.append((first_of(part_headers), body, part_hi, depth + 1, inner))
                continue
        count += 1
        yield _leaf(hdrs, ctype, cparams, view, lo, hi)


_BLANK = re.compile(rb"[ \t\r\n]*")


def _leaf(
    hdrs: Mapping[str, str],
    ctype: str,
    cparams: Mapping[str, str],
    view: memoryview,
    lo: int,
    hi: int,
) -> Leaf:
    disp_raw = hdrs.get("content-disposition")
    disposition, dparams = params(disp_raw) if disp_raw else ("", _NO_PARAMS)
    filename = dparams.get("filename") or cparams.get("name")
    if filename is not None:
        filename = cap(one_line(decode_words(filename)), MAX_FILENAME) or None
    cte = hdrs.get("content-transfer-encoding")
    encoding = strip_comments(cte).strip().lower() if cte else ""
    charset = cparams.get("charset")
    return Leaf(ctype, charset, disposition, filename, encoding, view[lo:hi], lo, hi)


# What follows "--" boundary on a delimiter line: "--" if it closes, then
# transport padding to the end of the line (RFC 2046 §5.1.1).
_DELIMITER_TAIL = re.compile(rb"(--)?[ \t]*\r?(?=\n|\Z)")


def _delimiters(data: bytes, boundary: str, lo: int, hi: int) -> Iterator[tuple[int, int, bool]]:
    """(start, end, closes) of each delimiter line in ``data[lo:hi]``, as one regex would.

    That regex, ``^--BOUNDARY(--)?[ \\t]*\\r?$`` (MULTILINE), would be
    compiled anew for every message (boundaries are unique), which costs more
    than the rest of the parse; instead each occurrence of ``--BOUNDARY`` is
    checked to start a line and to be followed by ``_DELIMITER_TAIL`` (the
    rest of that regex, the same backtracking included).  The search goes on
    after a match's end, or one byte after a miss, as ``finditer`` does.
    """
    needle = b"--" + boundary.encode("utf-8", "replace")
    tail = _DELIMITER_TAIL.match
    pos = lo
    while True:
        start = data.find(needle, pos, hi)
        if start < 0:
            return
        at_line = start == lo or data[start - 1] == 0x0A
        m = tail(data, start + len(needle), hi) if at_line else None
        if m is None:
            pos = start + 1
            continue
        yield start, m.end(), m.group(1) is not None
        pos = m.end()


def split_multipart(data: bytes, boundary: str) -> list[bytes]:
    """The parts between the delimiter lines; none when the boundary never occurs."""
    return [data[lo:hi] for lo, hi in multipart_spans(data, boundary, 0, len(data))]


def multipart_spans(data: bytes, boundary: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """``split_multipart`` of ``data[lo:hi]`` as (start, end) offsets into ``data``."""
    spans: list[tuple[int, int]] = []
    if not boundary:
        return spans
    start: int | None = None
    for found, found_end, closes in _delimiters(data, boundary, lo, hi):
        if start is not None:
            end = found
            # The line break before a delimiter belongs to the delimiter.
            if end > start and data[end - 1] == 0x0A:
                end -= 2 if end - 1 > start and data[end - 2] == 0x0D else 1
            spans.append((start, end))
            if len(spans) >= MAX_PARTS:
                return spans
        if closes:
            return spans
        nl = data.find(b"\n", found_end, hi)
        start = hi if nl < 0 else nl + 1
    if start is not None and start <= hi:
        spans.append((start, hi))
    return spans


# ---------------------------------------------------------------------------
# Text


def lf(text: str) -> str:
    """Line breaks as LF: each CRLF, then each other CR, becomes one LF."""
    if "\r" not in text:
        return text
    if _LONE_CR.search(text) is None:
        # Every CR starts a CRLF (LMTP mail is all CRLF): dropping the CRs
        # is what the replaces below do, and cheaper (a 2-character replace
        # is slow in CPython).
        return text.replace("\r", "")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def cap_utf8(text: str, limit: int) -> str:
    """At most ``limit`` bytes of UTF-8, cut on a character boundary."""
    if len(text) * 4 <= limit:
        return text
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")
