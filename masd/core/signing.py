"""Signed requests (docs/protocol.md §9.8): Standard Webhooks' HMAC-SHA256 scheme, pure.

A secret is written ``whsec_`` + base64 of its key (at least
:data:`MIN_KEY_BYTES` bytes).  A request carries three headers:
``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
``webhook-signature``, a space-separated list of ``v1,<base64 HMAC-SHA256 of
"id.timestamp.body">``, one per secret of the sender.  A receiver accepts the
request when one listed ``v1`` signature matches one of its secrets and the
timestamp is within :data:`TOLERANCE` seconds of its clock, either way.

Nothing here raises for what a client sends: :func:`problem` answers with a
text naming the header that failed, or None.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Iterable, Sequence
from typing import Final

PREFIX: Final = "whsec_"
MIN_KEY_BYTES: Final = 24
#: Seconds a signed request's timestamp may differ from the receiver's clock.
TOLERANCE: Final = 300
ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
SIGNATURE_HEADER: Final = "webhook-signature"
#: A timestamp is at most this many digits (Unix seconds until the year 33658).
_MAX_DIGITS: Final = 12


def parse_secret(text: str) -> bytes:
    """The key of a ``whsec_`` secret; ValueError saying what is wrong with it."""
    if not text.startswith(PREFIX):
        raise ValueError(f"does not start with {PREFIX}")
    encoded = text[len(PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"what follows {PREFIX} is not base64") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"holds {len(key)} bytes, fewer than {MIN_KEY_BYTES}")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``msg_id.timestamp.body`` by ``key``."""
    # A header's bytes as they came (an id that is not UTF-8 is kept, not refused).
    signed = b"%s.%d.%s" % (msg_id.encode("utf-8", "surrogateescape"), timestamp, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a request signed by every key in ``keys``."""
    return {
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(signature(k, msg_id, timestamp, body) for k in keys),
    }


def problem(
    keys: Iterable[bytes], header: Callable[[str], str | None], body: bytes, now: float
) -> str | None:
    """Why a request does not carry a valid signature by one of ``keys``; None when it does.

    ``header(name)`` is the request's header ``name`` (None when absent).
    """
    values = {}
    for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER):
        value = header(name)
        if value is None or not value.strip():
            return f"{name}: missing (this peer must sign its requests)"
        values[name] = value.strip()
    stamp = values[TIMESTAMP_HEADER]
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= _MAX_DIGITS):
        return f"{TIMESTAMP_HEADER}: {stamp[:40]!r} is not Unix seconds"
    if abs(int(stamp) - now) > TOLERANCE:
        return (
            f"{TIMESTAMP_HEADER}: {stamp} is more than {TOLERANCE} s from masd's clock ({int(now)})"
        )
    listed = values[SIGNATURE_HEADER].split(" ")
    given = [s[3:] for s in listed if s.startswith("v1,") and s.isascii()]
    expected = [signature(k, values[ID_HEADER], int(stamp), body)[3:].encode("ascii") for k in keys]
    # Every pair is compared, whatever matches first, in constant time each.
    matched = [hmac.compare_digest(g.encode("ascii"), e) for g in given for e in expected]
    if not any(matched):
        what = "no v1 signature" if not given else "no v1 signature matches the body"
        return f"{SIGNATURE_HEADER}: {what} by one of this peer's secrets"
    return None
