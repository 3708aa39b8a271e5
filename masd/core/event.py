"""The gateway event: one inbound mail, normalized (PROFILE §12).

"The ``event`` in ``case.intake`` and ``case.message`` is the normalized
inbound mail ... Decoding is tolerant (unknown fields ignored); encoding is
strict (every field bounded)."

``build_event`` turns raw message bytes into a :class:`GatewayEvent` plus the
trust verdicts the engine needs (:class:`ParsedMail`).  It never refuses mail
for its content: malformed MIME, unknown charsets, 8-bit headers, a missing
From or Message-ID all give an event with empty or ``None`` fields.  The only
:class:`EventError` it raises is for bad *caller* input (``received_at`` not
RFC 3339, an empty or over-long ``message_ref``), code ``invalid-event``; the
same code names every refusal of :meth:`GatewayEvent.from_json`.

The message is read in one pass with a small MIME reader written for this hot
path (LMTP: thousands of small messages a second) instead of ``email.policy``
header objects: headers are split and unfolded once, multipart bodies are cut
on their delimiter lines with one compiled regex per boundary, so the cost is
linear in the size of the message times the nesting depth (at most
``MAX_MIME_DEPTH``).  The raw bytes are only read, never changed.
"""

from __future__ import annotations

import binascii
import codecs
import hashlib
import html
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.utils import getaddresses
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

from masd.core.errors import EventError
from masd.core.trust import (
    AUTOMATION_HEADERS,
    DMARC_RESULTS,
    AuthVerdict,
    Automation,
    TrustSettings,
    domain_key,
    read_auth,
    read_automation,
    strip_comments,
)

__all__ = [
    "MAX_ADDRESS",
    "MAX_ATTACHMENTS",
    "MAX_CONTENT_TYPE",
    "MAX_DATE",
    "MAX_FILENAME",
    "MAX_MESSAGE_ID",
    "MAX_MESSAGE_REF",
    "MAX_NAME",
    "MAX_REASON",
    "MAX_REFERENCES",
    "MAX_SUBJECT",
    "MAX_TEXT_BYTES",
    "Attachment",
    "GatewayEvent",
    "ParsedMail",
    "build_event",
    "decode_words",
    "parse_headers",
]

# ---------------------------------------------------------------------------
# Bounds (mirrored as maxLength / maxItems in mas-event-v0.1.schema.json).
# Values over a bound are truncated by build_event and refused by from_json.

MAX_SUBJECT = 998  # RFC 5322 §2.1.1: a line is at most 998 characters
MAX_MESSAGE_ID = 998  # message_id, in_reply_to and each of references
MAX_REFERENCES = 100  # the first (thread root) and the last 99 are kept
MAX_NAME = 256  # from.name
MAX_ADDRESS = 320  # from.address, mail_from, rcpt_to: 64 + "@" + 255
MAX_FILENAME = 255
MAX_DATE = 256
MAX_TEXT_BYTES = 256 * 1024  # text: at most 256 KiB of UTF-8
MAX_ATTACHMENTS = 100
MAX_CONTENT_TYPE = 255  # RFC 6838 §4.2: type and subtype of 127 each
MAX_MESSAGE_REF = 256
MAX_REASON = 256  # automated.reason
MAX_AUTHSERV_ID = 255

#: Multipart entities nested deeper than this are not opened: the entity at
#: the limit is listed as one attachment.  Real mail nests a handful of levels
#: (mixed > alternative > related); the limit bounds the work on hostile mail.
MAX_MIME_DEPTH = 16
#: Leaf parts looked at; later ones are ignored (the raw message keeps them).
MAX_PARTS = 1000
#: HTML characters fed to the HTML-to-text converter when there is no
#: text/plain part; the text is cut at MAX_TEXT_BYTES anyway.
MAX_HTML_CHARS = 1024 * 1024

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _refuse(detail: str) -> EventError:
    return EventError(detail, code="invalid-event")


# ---------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class Attachment:
    """Metadata of one attachment; the contents stay with email."""

    filename: str | None
    content_type: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        _check_opt_str("attachments[].filename", self.filename, MAX_FILENAME)
        _check_str("attachments[].content_type", self.content_type, MAX_CONTENT_TYPE)
        if type(self.size) is not int or self.size < 0:
            raise _refuse(f"attachments[].size must be a non-negative integer, not {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise _refuse(f"attachments[].sha256 must be 64 lowercase hex digits: {self.sha256!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "content_type": self.content_type,
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class GatewayEvent:
    """The normalized inbound mail (PROFILE §12).  Every field is bounded."""

    message_ref: str
    received_at: str
    mail_from: str
    rcpt_to: str
    message_id: str | None
    in_reply_to: str | None
    references: tuple[str, ...]
    from_address: str
    from_name: str | None
    subject: str
    date: str | None
    text: str
    attachments: tuple[Attachment, ...]
    dmarc: str
    authserv_id: str | None
    automated: bool
    automated_reason: str | None

    def __post_init__(self) -> None:
        # "encoding is strict (every field bounded)": an event that exists is valid.
        _check_str("message_ref", self.message_ref, MAX_MESSAGE_REF)
        if not self.message_ref:
            raise _refuse("message_ref must not be empty")
        _check_str("received_at", self.received_at, 64)
        if not _RFC3339.fullmatch(self.received_at):
            raise _refuse(f"received_at is not an RFC 3339 timestamp: {self.received_at!r}")
        _check_str("mail_from", self.mail_from, MAX_ADDRESS)
        _check_str("rcpt_to", self.rcpt_to, MAX_ADDRESS)
        _check_opt_str("message_id", self.message_id, MAX_MESSAGE_ID)
        _check_opt_str("in_reply_to", self.in_reply_to, MAX_MESSAGE_ID)
        if not isinstance(self.references, tuple) or len(self.references) > MAX_REFERENCES:
            raise _refuse(f"references must be a list of at most {MAX_REFERENCES} ids")
        for ref in self.references:
            _check_str("references[]", ref, MAX_MESSAGE_ID)
        _check_str("from.address", self.from_address, MAX_ADDRESS)
        _check_opt_str("from.name", self.from_name, MAX_NAME)
        _check_str("subject", self.subject, MAX_SUBJECT)
        _check_opt_str("date", self.date, MAX_DATE)
        if not isinstance(self.text, str):
            raise _refuse("text must be a string")
        if len(self.text) * 4 > MAX_TEXT_BYTES and _utf8_len(self.text) > MAX_TEXT_BYTES:
            raise _refuse(f"text is over {MAX_TEXT_BYTES} bytes of UTF-8")
        if not isinstance(self.attachments, tuple) or len(self.attachments) > MAX_ATTACHMENTS:
            raise _refuse(f"attachments must be a list of at most {MAX_ATTACHMENTS} entries")
        for att in self.attachments:
            if not isinstance(att, Attachment):
                raise _refuse("attachments[] must be attachment objects")
        if self.dmarc not in DMARC_RESULTS:
            raise _refuse(f"auth.dmarc must be one of {sorted(DMARC_RESULTS)}: {self.dmarc!r}")
        _check_opt_str("auth.authserv_id", self.authserv_id, MAX_AUTHSERV_ID)
        if not isinstance(self.automated, bool):
            raise _refuse("automated.is must be a boolean")
        _check_opt_str("automated.reason", self.automated_reason, MAX_REASON)

    def to_json(self) -> dict[str, Any]:
        """The event object exactly as the schema shapes it."""
        return {
            "message_ref": self.message_ref,
            "received_at": self.received_at,
            "mail_from": self.mail_from,
            "rcpt_to": self.rcpt_to,
            "message_id": self.message_id,
            "in_reply_to": self.in_reply_to,
            "references": list(self.references),
            "from": {"address": self.from_address, "name": self.from_name},
            "subject": self.subject,
            "date": self.date,
            "text": self.text,
            "attachments": [a.to_json() for a in self.attachments],
            "auth": {"dmarc": self.dmarc, "authserv_id": self.authserv_id},
            "automated": {"is": self.automated, "reason": self.automated_reason},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GatewayEvent:
        """Read an event; unknown fields are ignored, missing or bad ones refused."""
        if not isinstance(data, Mapping):
            raise _refuse("event must be an object")
        sender = _obj(data, "from")
        auth = _obj(data, "auth")
        automated = _obj(data, "automated")
        refs = _get(data, "references", "references")
        if not isinstance(refs, list):
            raise _refuse("references must be a list")
        atts = _get(data, "attachments", "attachments")
        if not isinstance(atts, list):
            raise _refuse("attachments must be a list")
        attachments = []
        for i, item in enumerate(atts):
            if not isinstance(item, Mapping):
                raise _refuse(f"attachments[{i}] must be an object")
            attachments.append(
                Attachment(
                    filename=_get(item, "filename", f"attachments[{i}].filename"),
                    content_type=_get(item, "content_type", f"attachments[{i}].content_type"),
                    size=_get(item, "size", f"attachments[{i}].size"),
                    sha256=_get(item, "sha256", f"attachments[{i}].sha256"),
                )
            )
        return cls(
            message_ref=_get(data, "message_ref", "message_ref"),
            received_at=_get(data, "received_at", "received_at"),
            mail_from=_get(data, "mail_from", "mail_from"),
            rcpt_to=_get(data, "rcpt_to", "rcpt_to"),
            message_id=_get(data, "message_id", "message_id"),
            in_reply_to=_get(data, "in_reply_to", "in_reply_to"),
            references=tuple(refs),
            from_address=_get(sender, "address", "from.address"),
            from_name=_get(sender, "name", "from.name"),
            subject=_get(data, "subject", "subject"),
            date=_get(data, "date", "date"),
            text=_get(data, "text", "text"),
            attachments=tuple(attachments),
            dmarc=_get(auth, "dmarc", "auth.dmarc"),
            authserv_id=_get(auth, "authserv_id", "auth.authserv_id"),
            automated=_get(automated, "is", "automated.is"),
            automated_reason=_get(automated, "reason", "automated.reason"),
        )


@dataclass(frozen=True)
class ParsedMail:
    """What the engine needs from one inbound mail beyond the event."""

    event: GatewayEvent
    auth: AuthVerdict
    automation: Automation
    #: every address of every From header, domain lowercased (A-labels)
    from_addresses: tuple[str, ...]


def _check_str(field: str, value: object, limit: int) -> None:
    if not isinstance(value, str):
        raise _refuse(f"{field} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise _refuse(f"{field} is longer than {limit} characters")


def _check_opt_str(field: str, value: object, limit: int) -> None:
    if value is not None:
        _check_str(field, value, limit)


def _get(obj: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in obj:
        raise _refuse(f"{field} is missing")
    return obj[key]


def _obj(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = _get(obj, key, key)
    if not isinstance(value, Mapping):
        raise _refuse(f"{key} must be an object")
    return value


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


# ---------------------------------------------------------------------------
# Charsets


# Labels that are lies in practice (as the WHATWG Encoding Standard treats
# them): us-ascii mail is often UTF-8, "ISO-8859-1" is windows-1252, and
# Shift_JIS / GB2312 / EUC-KR mail uses the vendor supersets.
_SUPERSETS = {
    "ascii": "utf-8",
    "iso8859-1": "cp1252",
    "shift_jis": "cp932",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "euc_kr": "cp949",
}
# Text codecs that are not mail charsets and could turn text into escapes.
_NOT_CHARSETS = frozenset({"unicode-escape", "raw-unicode-escape", "idna", "punycode", "undefined"})


@lru_cache(maxsize=256)
def _codec(label: str) -> str:
    """The Python codec for a MIME charset label; unknown labels give UTF-8."""
    name = label.strip().strip("\"'").lower()
    if not name or len(name) > 64:
        return "utf-8"
    try:
        info = codecs.lookup(name)
    except LookupError:
        return "utf-8"
    if not info._is_text_encoding or info.name in _NOT_CHARSETS:
        return "utf-8"
    return _SUPERSETS.get(info.name, info.name)


def _decode(data: bytes, charset: str | None) -> str:
    """Bytes to text, never failing: bad bytes become U+FFFD."""
    if not data:
        return ""
    codec = _codec(charset) if charset else "utf-8"
    try:
        text = data.decode(codec, "replace")
    except (UnicodeError, LookupError, ValueError, TypeError):
        text = data.decode("utf-8", "replace")
    return _scrub(text)


def _scrub(text: str) -> str:
    """Replace lone surrogates (some codecs produce them) so the text is UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _b64decode(data: bytes) -> bytes:
    """Tolerant base64: junk characters are skipped and padding repaired."""
    clean = data.translate(None, _B64_JUNK)
    extra = len(clean) % 4
    if extra == 1:
        clean = clean[:-1]
        extra = 0
    if extra:
        clean += b"=" * (4 - extra)
    try:
        return binascii.a2b_base64(clean)
    except binascii.Error:
        return b""


_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_JUNK = bytes(b for b in range(256) if b not in _B64_ALPHABET)


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
            out.append(_decode(bytes(pending), pending_cs))
            pending.clear()
        if not joined:
            out.append(gap)
        raw = m.group(3).encode("utf-8", "surrogateescape")
        if m.group(2) in "bB":
            pending += _b64decode(raw)
        else:
            pending += binascii.a2b_qp(raw, header=True)
        pending_cs = charset
        pos = m.end()
        after_word = True
    if pending:
        out.append(_decode(bytes(pending), pending_cs))
    out.append(value[pos:])
    return "".join(out)


# ---------------------------------------------------------------------------
# Headers

_HEADER_NAME = re.compile(rb"([\x21-\x39\x3b-\x7e]+)[ \t]*:")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]+")


def _header_text(raw: bytes) -> str:
    if raw.isascii():
        return raw.decode("ascii")
    # RFC 6532 allows UTF-8 in headers; other 8-bit bytes are a guess at best.
    return _scrub(raw.decode("utf-8", "replace"))


def _split_entity(data: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """(headers, body) of one entity: names as written, values unfolded.

    Headers end at the first empty line.  A line that is neither a header nor
    a continuation starts the body (as the stdlib parser does), and an mbox
    ``From `` line at the very top is skipped.
    """
    if data.startswith(b"From "):
        nl = data.find(b"\n")
        data = data[nl + 1 :] if nl >= 0 else b""
    simple = _split_simple(data)
    if simple is not None:
        return simple
    return _split_lines(data)


# The end of a header block: the line break before the first empty line.
_BLOCK_END = re.compile(rb"\n\r?\n")
# A CR that does not end a line.
_LONE_CR = re.compile(r"\r(?!\n)")
# One line of a decoded header block with its line breaks as LF only: a
# header field (name, then its value up to the end of its last continuation
# line, the inner LFs still in it), or else (group 3) any other line.
_FIELD = re.compile(r"([\x21-\x39\x3b-\x7e]+)[ \t]*:([^\n]*(?:\n[ \t][^\n]*)*)\n|([^\n]*\n)")


def _split_simple(data: bytes) -> tuple[list[tuple[str, str]], bytes] | None:
    """``_split_lines`` for the common entity, in a few C-level passes; else None.

    It answers only when the headers end at an empty line, every line above
    it is a header or a continuation, the block is valid UTF-8 (ASCII
    included) and every CR in it ends a line.  Then it reads the same
    fields: ``_split_lines`` drops one CR at the end of each line, here all
    CRs go at once (each one ends a line); ``_FIELD`` takes exactly the
    lines ``_split_lines`` joins into one field (a name line as
    ``_HEADER_NAME`` reads it, then the lines starting with SP or HTAB); the
    line breaks are dropped and SP/HTAB stripped as in ``_header_pair``.
    Decoding the whole block at once equals decoding each value, since valid
    UTF-8 cut at ASCII line breaks stays valid (and ``_scrub`` has nothing to
    do).  None (no empty line, a line that is not a header, 8-bit or
    malformed headers, a lone CR) means "ask ``_split_lines``".
    """
    end = _BLOCK_END.search(data)
    if end is None:
        return None
    try:
        text = data[: end.start() + 1].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\r" in text:
        if _LONE_CR.search(text) is not None:
            return None
        text = text.replace("\r", "")
    headers: list[tuple[str, str]] = []
    for name, value, other in _FIELD.findall(text):
        if other:
            return None  # not a header: _split_lines starts the body early
        if "\n" in value:
            value = value.replace("\n", "")
        headers.append((name, value.strip(" \t")))
    return headers, data[end.end() :]


def _split_lines(data: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """``_split_entity`` line by line, for any bytes at all."""
    headers: list[tuple[str, str]] = []
    pos = 0
    n = len(data)
    name = b""
    parts: list[bytes] = []
    while pos < n:
        nl = data.find(b"\n", pos)
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
    return headers, data[pos:]


def _header_pair(name: bytes, parts: list[bytes]) -> tuple[str, str]:
    value = _header_text(b"".join(parts)).strip(" \t")
    return name.decode("ascii"), value


def parse_headers(raw: bytes) -> list[tuple[str, str]]:
    """The top-level headers of a message: (name, unfolded value), in order."""
    return _split_entity(raw)[0]


def _one_line(value: str) -> str:
    """A header-derived field: no CR, LF, NUL or other control characters."""
    if value.isprintable():  # no Cc character at all, so nothing to replace
        return value.strip()
    return _CONTROL.sub(" ", value).strip()


def _cap(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit]


# ---------------------------------------------------------------------------
# MIME parameters (RFC 2045 §5.1, RFC 2231)

_PARAM = re.compile(r';\s*([^\s=;"]+)\s*=\s*("(?:[^"\\]|\\.)*"?|[^;]*)')
_SECTION = re.compile(r"([^*]+)(?:\*(\d{1,3}))?(\*)?")
_QUOTED_PAIR = re.compile(r"\\(.)")


def _params(value: str) -> tuple[str, Mapping[str, str]]:
    """(lowercase main value, parameters) of Content-Type / Content-Disposition.

    Short values are cached (``text/plain; charset=utf-8`` repeats from
    message to message): the answer depends on the value alone, and callers
    only read the mapping.
    """
    if len(value) <= 256:
        return _params_cached(value)
    return _read_params(value)


@lru_cache(maxsize=1024)
def _params_cached(value: str) -> tuple[str, Mapping[str, str]]:
    return _read_params(value)


def _read_params(value: str) -> tuple[str, Mapping[str, str]]:
    """``_params`` uncached.

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
        params[base] = _decode(bytes(data), charset or "utf-8")
    return main, params


# ---------------------------------------------------------------------------
# MIME structure


class _Leaf(NamedTuple):
    """One leaf part (a tuple: built once per part on the hot path)."""

    content_type: str
    charset: str | None
    disposition: str
    filename: str | None
    encoding: str
    body: bytes

    def decoded(self) -> bytes:
        if self.encoding == "base64":
            return _b64decode(self.body)
        if self.encoding == "quoted-printable":
            return binascii.a2b_qp(self.body)
        return self.body

    @property
    def attachment_like(self) -> bool:
        return self.disposition == "attachment" or self.filename is not None


def _first_of(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Each lowercase header name's first value (what a top-down search finds)."""
    first: dict[str, str] = {}
    for name, value in headers:
        first.setdefault(name.lower(), value)
    return first


_NO_PARAMS: Mapping[str, str] = {}


def _leaves(first: Mapping[str, str], body: bytes) -> Iterator[_Leaf]:
    """The leaf parts of a message in document order, iteratively.

    RFC 2045 §5.2: a missing or unparseable Content-Type means text/plain;
    a multipart without a boundary is treated the same way.  message/* parts
    are leaves: an attached message is one attachment, and its own parts are
    never mistaken for the body.  A missing close delimiter ends the last
    part at the end of the entity (RFC 2046 §5.1.1 asks for one; mail
    without it is common enough).
    """
    # ``first`` is the entity's _first_of map, built once per entity.
    stack: list[tuple[Mapping[str, str], bytes, int]] = [(first, body, 0)]
    count = 0
    while stack and count < MAX_PARTS:
        hdrs, data, depth = stack.pop()
        ctype_raw = hdrs.get("content-type")
        ctype, params = _params(ctype_raw) if ctype_raw else ("text/plain", _NO_PARAMS)
        if "/" not in ctype or len(ctype) > MAX_CONTENT_TYPE or not ctype.isascii():
            ctype, params = "text/plain", _NO_PARAMS
        boundary = params.get("boundary", "")
        if ctype.startswith("multipart/"):
            if not boundary:
                ctype = "text/plain"
            elif depth < MAX_MIME_DEPTH:
                parts = _split_multipart(data, boundary)
                for part in reversed(parts):
                    part_headers, part_body = _split_entity(part)
                    stack.append((_first_of(part_headers), part_body, depth + 1))
                continue
        disp_raw = hdrs.get("content-disposition")
        disposition, dparams = _params(disp_raw) if disp_raw else ("", _NO_PARAMS)
        filename = dparams.get("filename") or params.get("name")
        if filename is not None:
            filename = _cap(_one_line(decode_words(filename)), MAX_FILENAME) or None
        cte = hdrs.get("content-transfer-encoding")
        encoding = strip_comments(cte).strip().lower() if cte else ""
        count += 1
        yield _Leaf(ctype, params.get("charset"), disposition, filename, encoding, data)


# What follows "--" boundary on a delimiter line: "--" if it closes, then
# transport padding to the end of the line (RFC 2046 §5.1.1).
_DELIMITER_TAIL = re.compile(rb"(--)?[ \t]*\r?(?=\n|\Z)")


def _delimiters(data: bytes, boundary: str) -> Iterator[tuple[int, int, bool]]:
    """(start, end, closes) of each delimiter line, as one regex would find them.

    That regex, ``^--BOUNDARY(--)?[ \\t]*\\r?$`` (MULTILINE), would be
    compiled anew for every message (boundaries are unique), which costs more
    than the rest of the parse; instead each occurrence of ``--BOUNDARY`` is
    checked to start a line and to be followed by ``_DELIMITER_TAIL`` (the
    rest of that regex, the same backtracking included).  The search goes on
    after a match's end, or one byte after a miss, as ``finditer`` does.
    """
    needle = b"--" + boundary.encode("utf-8", "replace")
    tail = _DELIMITER_TAIL.match
    pos = 0
    while True:
        start = data.find(needle, pos)
        if start < 0:
            return
        m = tail(data, start + len(needle)) if start == 0 or data[start - 1] == 0x0A else None
        if m is None:
            pos = start + 1
            continue
        yield start, m.end(), m.group(1) is not None
        pos = m.end()


def _split_multipart(data: bytes, boundary: str) -> list[bytes]:
    parts: list[bytes] = []
    start: int | None = None
    for found, found_end, closes in _delimiters(data, boundary):
        if start is not None:
            end = found
            # The line break before a delimiter belongs to the delimiter.
            if end > start and data[end - 1 : end] == b"\n":
                end -= 2 if end - 1 > start and data[end - 2 : end - 1] == b"\r" else 1
            parts.append(data[start:end])
            if len(parts) >= MAX_PARTS:
                return parts
        if closes:
            return parts
        nl = data.find(b"\n", found_end)
        start = len(data) if nl < 0 else nl + 1
    if start is not None and start <= len(data):
        parts.append(data[start:])
    return parts


# ---------------------------------------------------------------------------
# Text

# Block elements start a new line; paragraph-like ones leave a blank line.
_PARAGRAPH_TAGS = frozenset(
    {
        *("blockquote", "dl", "figure", "form", "h1", "h2", "h3", "h4", "h5", "h6"),
        *("hr", "ol", "p", "pre", "table", "ul"),
    }
)
_LINE_TAGS = frozenset(
    {
        *("address", "article", "aside", "dd", "div", "dt", "fieldset", "figcaption"),
        *("footer", "header", "li", "main", "nav", "section", "tbody", "td", "tfoot"),
        *("th", "thead", "tr"),
    }
)
_SKIP_TAGS = frozenset({"head", "title", "template", "noscript"})
_SPACES = re.compile(r"[ \t\f\v\r\n\u00a0]+")


_STRAY_LT = re.compile(r"<(?:(?=[^<>]*(?:<|\Z))|(?=\?)|(?=!(?!--|doctype)))", re.IGNORECASE)


def _stray_lt(text: str) -> str:
    return _STRAY_LT.sub("&lt;", text)


def _defuse(source: str) -> str:
    """Escape every ``<`` that no ``>`` closes before the next ``<``.

    Such a ``<`` cannot start a tag, so it is text.  Markup declarations
    other than comments and DOCTYPE (``<![CDATA[``, ``<!x``) and processing
    instructions (``<?``) mean nothing in mail and become text too.
    Comments are kept whole (they may hold tags); an unclosed comment is
    text.  Afterwards every ``<`` has its ``>`` before the next ``<`` and
    every comment its ``-->``, which keeps the tokenizer below linear.
    """
    out: list[str] = []
    pos = 0
    while True:
        start = source.find("<!--", pos)
        if start < 0:
            break
        end = source.find("-->", start + 4)
        if end < 0:
            break
        out.append(_stray_lt(source[pos:start]))
        out.append(source[start : end + 3])
        pos = end + 3
    out.append(_stray_lt(source[pos:]).replace("<!--", "&lt;!--"))
    return "".join(out)


# One token of HTML: a tag (group 1 "/" for an end tag, group 2 its name),
# or a comment, declaration or processing instruction (no groups).
_HTML_TOKEN = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)[^>]*>|<!--.*?-->|<![^>]*>|<\?[^>]*>", re.DOTALL)
_RAW_TEXT_TAGS = frozenset({"script", "style"})


class _TextSink:
    """Collects visible text; line breaks are owed, not written.

    A block boundary asks for one line break (a paragraph for two) before
    the next visible text, so nested blocks and whitespace between tags do
    not pile up empty lines.
    """

    def __init__(self) -> None:
        self.out: list[str] = []
        self.owed = 0

    def block(self, tag: str) -> None:
        if tag == "br":
            self.owed = min(self.owed + 1, 2)
        elif tag in _PARAGRAPH_TAGS:
            self.owed = 2
        elif tag in _LINE_TAGS:
            self.owed = max(self.owed, 1)

    def data(self, raw: str, pre: bool) -> None:
        text = html.unescape(raw)
        if not pre:
            text = _SPACES.sub(" ", text)
        if self.owed:
            if not text.strip():
                return
            if self.out:
                self.out.append("\n" * self.owed)
            text = text.lstrip(" ")
            self.owed = 0
        self.out.append(text)


def _html_to_text(source: str) -> str:
    """Visible text of an HTML body, in one linear pass.

    ``html.parser`` is not used: on Python 3.11 it rescans the rest of the
    input for each unfinished construct (quadratic: ``<a x='>'`` repeated a
    few thousand times takes seconds).  Tags are dropped, script, style and
    head content skipped, entities decoded with ``html.unescape``.
    """
    doc = _defuse(source[:MAX_HTML_CHARS])
    lower = doc.lower()
    sink = _TextSink()
    skip = 0
    pre = 0
    pos = 0
    n = len(doc)
    while pos < n:
        m = _HTML_TOKEN.search(doc, pos)
        end = n if m is None else m.start()
        if end > pos and not skip:
            sink.data(doc[pos:end], pre > 0)
        if m is None:
            break
        pos = m.end()
        name = m.group(2)
        if name is None:
            continue
        tag = name.lower()
        closing = m.group(1) == "/"
        if tag in _RAW_TEXT_TAGS and not closing:
            close = lower.find("</" + tag, pos)
            pos = n if close < 0 else close
            continue
        if tag in _SKIP_TAGS:
            skip = max(0, skip - 1) if closing else skip + 1
        elif tag == "pre":
            pre = max(0, pre - 1) if closing else pre + 1
        sink.block(tag)
    lines = (line.strip(" ") for line in "".join(sink.out).split("\n"))
    return "\n".join(lines).strip("\n")


def _body_text(leaf: _Leaf) -> str:
    text = _lf(_decode(leaf.decoded(), leaf.charset))
    if leaf.content_type == "text/html":
        text = _html_to_text(text)
    return _cap_utf8(text.replace("\x00", "\ufffd"), MAX_TEXT_BYTES)


def _lf(text: str) -> str:
    """Line breaks as LF: each CRLF, then each other CR, becomes one LF."""
    if "\r" not in text:
        return text
    if _LONE_CR.search(text) is None:
        # Every CR starts a CRLF (LMTP mail is all CRLF): dropping the CRs
        # is what the replaces below do, and cheaper (a 2-character replace
        # is slow in CPython).
        return text.replace("\r", "")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _cap_utf8(text: str, limit: int) -> str:
    """At most ``limit`` bytes of UTF-8, cut on a character boundary."""
    if len(text) * 4 <= limit:
        return text
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


# ---------------------------------------------------------------------------
# Addresses and ids

_MSG_ID = re.compile(r"<[^<>\s]*>")


def _address_key(address: str) -> str:
    """An address with its domain lowercased in A-label form; the local part kept."""
    local, at, domain = address.rpartition("@")
    if not at:
        return address
    return f"{local}@{domain_key(domain)}"


# The plain From forms, in which email.utils.getaddresses finds exactly one
# (name, address) pair that can be read off the text (see _plain_from):
# ``local@domain`` or ``[phrase] <local@domain>``, the phrase being one
# quoted string or atoms separated by spaces.  Local part and domain are
# ASCII dot-atoms (RFC 5322 §3.2.3), so the parser keeps them as written.
_DOT_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_ADDR_SPEC = rf"{_DOT_ATOM}@{_DOT_ATOM}"
# An atom of a phrase as the parser reads it, less every whitespace character.
_PHRASE_ATOM = r'[^\s()<>@,:;"\[\]]+'
_PLAIN_FROM = re.compile(
    rf"(?P<bare>{_ADDR_SPEC})"
    r'|(?:"(?P<quoted>[^"\\\r\n]*)"[ ]*'
    rf"|(?P<atoms>{_PHRASE_ATOM}(?:[ ]+{_PHRASE_ATOM})*)[ ]*)?"
    rf"<(?P<angle>{_ADDR_SPEC})>"
)


def _plain_from(value: str) -> tuple[str, str] | None:
    """``getaddresses([value])``'s one pair for a plain From value, else None.

    Where it answers, the stdlib parser (``email._parseaddr``) reads the same:
    a bare dot-atom address gives ``("", address)``; before ``<``, a quoted
    string without backslash or CR is its inner text, and atoms (runs of
    characters outside its phrase ends ``()<>@,:;"[]`` and whitespace, "."
    included) are joined with one space; the route-addr is the address as
    written.  The caller has turned tabs into spaces already.
    tests/test_event_fast.py checks it against ``getaddresses``.
    """
    m = _PLAIN_FROM.fullmatch(value)
    if m is None:
        return None
    bare, quoted, atoms, angle = m.group("bare", "quoted", "atoms", "angle")
    if bare is not None:
        return "", bare
    if quoted is not None:
        return quoted, angle
    return (" ".join(atoms.split()) if atoms else ""), angle


def _from_fields(values: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """(every From address, display name of the first) from the From headers."""
    if not values:
        return (), None
    # The stdlib address parser recurses once per nested comment: values
    # with many comments lose them first (names in comments are rare).
    values = [(strip_comments(v) if v.count("(") > 32 else v).replace("\t", " ") for v in values]
    # getaddresses parses the values joined with ", "; values that are each
    # one plain address give their pairs in order (a "," after a plain
    # address only ends it), so the parser is needed only for the others.
    pairs: list[tuple[str, str]] = []
    for value in values:
        pair = _plain_from(value)
        if pair is None:
            pairs = getaddresses(values)
            break
        pairs.append(pair)
    addresses: list[str] = []
    first_name: str | None = None
    for name, addr in pairs:
        addr = _one_line(addr)
        if not addr or "@" not in addr:
            continue
        if not addresses:
            first_name = _cap(_one_line(decode_words(name)), MAX_NAME) or None
        addresses.append(_address_key(addr))
    return tuple(addresses), first_name


def _msg_id(value: str | None) -> str | None:
    """The first ``<id>`` of a header, with its brackets; a bare id gets them."""
    if value is None:
        return None
    m = _MSG_ID.search(value)
    if m is not None:
        found = m.group()
        return _cap(found, MAX_MESSAGE_ID) if len(found) > 2 else None
    bare = _one_line(value)
    if bare and not any(c.isspace() for c in bare):
        return _cap(f"<{bare}>", MAX_MESSAGE_ID)
    return None


def _references(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    ids = [_cap(m.group(), MAX_MESSAGE_ID) for m in _MSG_ID.finditer(value) if len(m.group()) > 2]
    if len(ids) > MAX_REFERENCES:
        # Keep the thread root and the most recent ancestors (RFC 5322 §3.6.4).
        ids = [ids[0], *ids[-(MAX_REFERENCES - 1) :]]
    return tuple(ids)


def _envelope(address: str) -> str:
    value = _one_line(address)
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    return _cap(value, MAX_ADDRESS)


# ---------------------------------------------------------------------------
# The event


def build_event(
    raw: bytes,
    *,
    mail_from: str,
    rcpt_to: str,
    received_at: str,
    message_ref: str,
    trust: TrustSettings,
) -> ParsedMail:
    """Read one inbound message into a gateway event and its trust verdicts.

    Never refuses the message for its content.  ``EventError`` (code
    ``invalid-event``) only for a bad ``received_at`` or ``message_ref``.
    """
    headers, body = _split_entity(raw)
    first: dict[str, str] = {}
    from_values: list[str] = []
    for name, value in headers:
        lname = name.lower()
        if lname == "from":
            from_values.append(value)
        first.setdefault(lname, value)

    from_addresses, from_name = _from_fields(from_values)
    envelope_from = _envelope(mail_from)
    # read_auth reads only Received and Authentication-Results headers, and
    # read_automation only AUTOMATION_HEADERS: a message with none of them
    # (the common plain mail) gives what an empty list gives.
    auth_headers = headers if "received" in first or "authentication-results" in first else ()
    auth = read_auth(auth_headers, from_addresses, trust)
    auto_headers = headers if not AUTOMATION_HEADERS.isdisjoint(first) else ()
    automation = read_automation(auto_headers, envelope_from)

    text = ""
    body_leaf: _Leaf | None = None
    html_leaf: _Leaf | None = None
    leaves = list(_leaves(first, body))
    for leaf in leaves:
        if leaf.attachment_like:
            continue
        if leaf.content_type == "text/plain":
            body_leaf = leaf
            break
        if leaf.content_type == "text/html" and html_leaf is None:
            html_leaf = leaf
    body_leaf = body_leaf or html_leaf
    if body_leaf is not None:
        text = _body_text(body_leaf)

    attachments: list[Attachment] = []
    for leaf in leaves:
        if len(attachments) >= MAX_ATTACHMENTS:
            break
        if leaf is body_leaf:
            continue
        if leaf.attachment_like or not leaf.content_type.startswith("text/"):
            data = leaf.decoded()
            attachments.append(
                Attachment(
                    filename=leaf.filename,
                    content_type=leaf.content_type,
                    size=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                )
            )

    subject = first.get("subject")
    date = first.get("date")
    event = GatewayEvent(
        message_ref=message_ref,
        received_at=received_at,
        mail_from=envelope_from,
        rcpt_to=_cap(_one_line(rcpt_to), MAX_ADDRESS),
        message_id=_msg_id(first.get("message-id")),
        in_reply_to=_msg_id(first.get("in-reply-to")),
        references=_references(first.get("references")),
        from_address=_cap(from_addresses[0], MAX_ADDRESS) if from_addresses else "",
        from_name=from_name,
        subject=_cap(_one_line(decode_words(subject)), MAX_SUBJECT) if subject else "",
        date=(_cap(_one_line(date), MAX_DATE) or None) if date is not None else None,
        text=text,
        attachments=tuple(attachments),
        dmarc=auth.dmarc,
        authserv_id=_cap(auth.authserv_id, MAX_AUTHSERV_ID) if auth.authserv_id else None,
        automated=automation.is_automated,
        automated_reason=_cap(automation.reason, MAX_REASON) if automation.reason else None,
    )
    return ParsedMail(event=event, auth=auth, automation=automation, from_addresses=from_addresses)
