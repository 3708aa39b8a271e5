"""Bytes to text and base64 to bytes, never failing: the decoders behind the MIME reader."""

from __future__ import annotations

import binascii
import codecs
import re
from functools import lru_cache

__all__ = ["b64decode", "b64repair", "decode", "scrub"]


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


def decode(data: bytes, charset: str | None) -> str:
    """Bytes to text, never failing: bad bytes become U+FFFD."""
    if not data:
        return ""
    codec = _codec(charset) if charset else "utf-8"
    try:
        text = data.decode(codec, "replace")
    except (UnicodeError, LookupError, ValueError, TypeError):
        text = data.decode("utf-8", "replace")
    return scrub(text)


def scrub(text: str) -> str:
    """Replace lone surrogates (some codecs produce them) so the text is UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def b64decode(data: bytes | memoryview) -> bytes:
    """Tolerant base64: junk characters are skipped and padding repaired.

    Where no "=" stands before more base64 data, the C decoder reads the
    same without the cleaned copy (it skips junk too, and refuses what would
    need repair): a large attachment is decoded from the message in place.
    """
    if _PAD_INSIDE.search(data) is None:
        try:
            return binascii.a2b_base64(data)
        except binascii.Error:
            pass
    return b64repair(data)


def b64repair(data: bytes | memoryview) -> bytes:
    """``b64decode`` the long way: junk removed, padding repaired, then decoded."""
    clean = bytes(data).translate(None, _B64_JUNK)
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
_PAD_INSIDE = re.compile(rb"=[^A-Za-z0-9+/]*[A-Za-z0-9+/]")
