"""The files inside a TNEF part (``application/ms-tnef``, Outlook's ``winmail.dat``).

TNEF is a binary container of attributes; the files carried in it are read
with ``tnefparse`` (pure Python, no I/O).  Its parser copies the rest of the
data once per attribute, so a part is opened only when attributes times size
stay under :data:`MAX_TNEF_WORK` (real ``winmail.dat`` files hold a few dozen
attributes): past it, or when the data is not TNEF, the part stays one opaque
attachment, listed as itself.
"""

from __future__ import annotations

import logging
import struct

import tnefparse

__all__ = ["MAX_TNEF_WORK", "TNEF_TYPES", "is_tnef", "tnef_files"]

TNEF_TYPES = frozenset({"application/ms-tnef", "application/vnd.ms-tnef"})
#: Bytes the parser may copy in all (attributes x size of the part).
MAX_TNEF_WORK = 512 * 1024 * 1024
_SIGNATURE = b"\x78\x9f\x3e\x22"

# tnefparse logs every attribute it does not know at DEBUG and malformed data at
# WARNING; a mail reader has no use for either (the part is listed regardless).
logging.getLogger("tnefparse").setLevel(logging.ERROR)


def is_tnef(content_type: str, filename: str | None) -> bool:
    return content_type in TNEF_TYPES or (filename or "").lower() == "winmail.dat"


def _attributes(data: bytes) -> int:
    """How many attributes the parser would read (it walks the same lengths)."""
    count = 0
    offset = 6
    n = len(data)
    while offset + 12 < n:
        (length,) = struct.unpack_from("<I", data, offset + 5)
        offset += min(n - offset, length + 11)
        count += 1
    return count


def _name(raw: object) -> str | None:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    return raw.strip("\x00").strip() or None


def tnef_files(data: bytes) -> list[tuple[str | None, bytes]]:
    """(long filename, bytes) of each file inside; [] for data that is not TNEF."""
    if not data.startswith(_SIGNATURE) or _attributes(data) * len(data) > MAX_TNEF_WORK:
        return []
    try:
        parsed = tnefparse.TNEF(data, do_checksum=False)
        return [(_name(a.long_filename()), bytes(a.data or b"")) for a in parsed.attachments]
    except Exception:  # noqa: BLE001  (a third-party parser on hostile bytes may raise anything)
        return []
