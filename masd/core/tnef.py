"""The files inside a TNEF part (``application/ms-tnef``, Outlook's ``winmail.dat``).

TNEF is a binary container of attributes; the files carried in it are read
with ``tnefparse`` (pure Python, no I/O).  Its parser copies the rest of the
data once per attribute, so a part is opened only when attributes times size
stay under :data:`MAX_TNEF_WORK` (real ``winmail.dat`` files hold a few dozen
attributes): past it, or when the data is not TNEF, the part stays one opaque
attachment, listed as itself.  So does a part whose MAPI lists declare more
properties or values than their bytes can hold (tnefparse would count through
all of them, some four billion).

A file's bytes are its declared length (profile §18): tnefparse strips trailing
NUL bytes from binary MAPI values (``rstrip(b"\x00")``), which cuts a file
carried in ``PR_ATTACH_DATA_OBJ`` (docs/tnefparse-trailing-nuls.md), so that
value is read again from the attribute's raw bytes by :func:`_declared_value`.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import tnefparse

__all__ = ["MAX_TNEF_WORK", "TNEF_TYPES", "is_tnef", "tnef_files"]

TNEF_TYPES = frozenset({"application/ms-tnef", "application/vnd.ms-tnef"})
#: Bytes the parser may copy in all (attributes x size of the part).
MAX_TNEF_WORK = 512 * 1024 * 1024
_SIGNATURE = b"\x78\x9f\x3e\x22"

# TNEF attributes (their low 16 bits, as tnefparse names them) and MAPI property
# tags of MS-OXTNEF: an attachment starts at its rendering data; its file is in
# attAttachData or, when attAttachment's MAPI list carries it, PR_ATTACH_DATA_OBJ.
_LVL_ATTACHMENT = 2
_ATT_ATTACH_REND_DATA = 0x9002
_ATT_ATTACH_DATA = 0x800F
_ATT_ATTACHMENT = 0x9005
_ATT_MAPI_PROPS = 0x9003
_ATT_RECIP_TABLE = 0x9004
_PR_ATTACH_DATA_OBJ = 0x3701
_MV_FLAG = 0x1000
_NAMED = 0x8000
#: Bytes of one value of each fixed-size MAPI type.
_FIXED = {0x02: 2, 0x0B: 2, 0x03: 4, 0x04: 4, 0x0A: 4, 0x05: 8, 0x06: 8, 0x07: 8, 0x14: 8}
_FIXED |= {0x40: 8, 0x48: 16}
#: Counted types: a length, the value, NUL padding to four bytes.
_COUNTED = frozenset({0x00, 0x0D, 0x1E, 0x1F, 0x102})
_BINARY = frozenset({0x00, 0x0D, 0x102})

# tnefparse logs every attribute it does not know at DEBUG and malformed data at
# WARNING; a mail reader has no use for either (the part is listed regardless).
logging.getLogger("tnefparse").setLevel(logging.ERROR)


def is_tnef(content_type: str, filename: str | None) -> bool:
    return content_type in TNEF_TYPES or (filename or "").lower() == "winmail.dat"


class _Hostile(ValueError):
    """A count no data of this size can hold: tnefparse would loop on it for hours."""


def _attributes(data: bytes) -> int:
    """How many attributes the parser would read (it walks the same lengths); raises
    :class:`_Hostile` where a MAPI list's counts exceed what its bytes can hold."""
    count = 0
    offset = 6
    n = len(data)
    while offset + 12 < n:
        (name, length) = struct.unpack_from("<xHxxI", data, offset)
        value = data[offset + 9 : offset + 9 + length]
        if name in (_ATT_MAPI_PROPS, _ATT_ATTACHMENT):
            _declared_value(value, -1)
        elif name == _ATT_RECIP_TABLE:
            _check_rows(value)
        offset += min(n - offset, length + 11)
        count += 1
    return count


def _check_rows(data: bytes) -> None:
    try:
        rows, offset = _bounded(data, 0, 4), 4
        for _ in range(rows):
            offset = _mapi_list(data, offset, -1)[0]
    except struct.error:
        return  # tnefparse stops there too


def _u32(data: bytes, offset: int) -> int:
    (value,) = struct.unpack_from("<I", data, offset)
    return int(value)


def _bounded(data: bytes, offset: int, size: int) -> int:
    """The count at ``offset``, of items of at least ``size`` bytes each."""
    count = _u32(data, offset)
    if count > (len(data) - offset) // size:
        raise _Hostile(f"a count of {count} at offset {offset} in {len(data)} bytes")
    return count


def _skip_name(data: bytes, offset: int) -> int:
    """Past a named property's GUID, kind and id or name."""
    offset += 16
    kind = _u32(data, offset)
    offset += 4
    return offset + 4 if kind == 0 else offset + 4 + -(-_u32(data, offset) // 4) * 4


def _mapi_list(data: bytes, offset: int, tag: int) -> tuple[int, bytes | None]:
    """Walk the MAPI property list at ``offset`` as tnefparse does (MS-OXTNEF 2.1.3.4): where
    it ends, and the first value of binary property ``tag`` at its declared length."""
    found = None
    end = offset + 4
    for _ in range(_bounded(data, offset, 4)):
        kind, prop = struct.unpack_from("<HH", data, end)
        end = _skip_name(data, end + 4) if prop >= _NAMED else end + 4
        multi = bool(kind & _MV_FLAG)
        kind &= ~_MV_FLAG
        count = 1
        if multi or kind in _COUNTED:  # a multi-value count, or a counted type's
            count = _bounded(data, end, 1)
            end += 4
        if kind in _FIXED:
            end += -(-_FIXED[kind] * count // 4) * 4
            continue
        if kind not in _COUNTED:
            raise struct.error(f"MAPI type {kind:#06x}")
        first = end + 4
        for _ in range(count):
            end += 4 + -(-_u32(data, end) // 4) * 4
        if prop == tag and kind in _BINARY and count and found is None:
            found = data[first : first + _u32(data, first - 4)]
    return end, found


def _declared_value(data: bytes, tag: int) -> bytes | None:
    """The first value of binary property ``tag`` in a MAPI property list, at the length
    the list declares for it; None when absent or unreadable."""
    try:
        return _mapi_list(data, 0, tag)[1]
    except struct.error:
        return None


def _declared_files(objects: list[Any]) -> list[bytes | None]:
    """Each attachment's file as declared: attAttachData, or attAttachment's
    PR_ATTACH_DATA_OBJ when it has one (the later wins, as in tnefparse)."""
    files: list[bytes | None] = []
    for obj in objects:
        name, level, data = obj.name, obj.level, obj.data
        if name == _ATT_ATTACH_REND_DATA:
            files.append(None)
        if level != _LVL_ATTACHMENT or not files or not isinstance(data, bytes):
            continue
        if name == _ATT_ATTACH_DATA:
            files[-1] = data
        elif name == _ATT_ATTACHMENT:
            value = _declared_value(data, _PR_ATTACH_DATA_OBJ)
            files[-1] = files[-1] if value is None else value
    return files


def _name(raw: object) -> str | None:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    return raw.strip("\x00").strip() or None


def tnef_files(data: bytes) -> list[tuple[str | None, bytes]]:
    """(long filename, bytes) of each file inside; [] for data that is not TNEF."""
    try:
        if not data.startswith(_SIGNATURE) or _attributes(data) * len(data) > MAX_TNEF_WORK:
            return []
    except _Hostile:
        return []
    try:
        parsed = tnefparse.TNEF(data, do_checksum=False)
        declared = _declared_files(parsed.objects)
        if len(declared) != len(parsed.attachments):
            declared = [None] * len(parsed.attachments)
        return [
            (_name(a.long_filename()), whole if whole is not None else bytes(a.data or b""))
            for a, whole in zip(parsed.attachments, declared, strict=True)
        ]
    except Exception:  # noqa: BLE001  (a third-party parser on hostile bytes may raise anything)
        return []
