"""Signed requests at the edges (docs/protocol.md §9.8), over :mod:`masd.core.signing`.

:func:`signed_headers` gives the headers of a request masd sends a peer that
has signing secrets; :func:`check_signature` decides whether a request from
a peer that must sign carries a valid signature, once its body is read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from multidict import MultiMapping

from masd.core import signing
from masd.service.peer_directory import Principal


def signed_headers(keys: Sequence[bytes], body: bytes, now: float) -> dict[str, str]:
    """``webhook-id`` (the message's ``id``), ``webhook-timestamp`` (``now``), the signatures."""
    return signing.headers(keys, _message_id(body), int(now), body)


#: The headers a signed request carries once each.
_ONCE: Final = (signing.ID_HEADER, signing.TIMESTAMP_HEADER, signing.SIGNATURE_HEADER)


def check_signature(
    principal: Principal, headers: MultiMapping[str], body: bytes, now: float
) -> str | None:
    """Why the request must be refused ``401`` (the detail, naming the header), or None.

    A request is checked when one of the peer entries its Bearer secret
    names has ``require_signature``; a signature by any secret of those
    entries is valid.  ``headers`` is looked up by its lower-case names
    (aiohttp's headers are case-insensitive).  A signature header on two lines is
    refused: none of them is a list whose lines may be joined (RFC 9110 §5.3), and a
    proxy reading one line while masd read another must not be possible.
    """
    entries = principal.peers
    if not any(p.signing.required for p in entries):
        return None
    for name in _ONCE:
        if (lines := len(headers.getall(name, ()))) > 1:
            return f"{name}: sent on {lines} lines; one line, its signatures space-separated"
    keys = [k for p in entries for k in p.signing.keys]
    return signing.problem(keys, headers.get, body, now)


def _message_id(body: bytes) -> str:
    """The body's envelope ``id``; a digest of the body if it has none (masd always sets one)."""
    try:
        found = json.loads(body).get("id")
    except (ValueError, AttributeError):
        found = None
    if isinstance(found, str) and found:
        return found
    return "msg_" + hashlib.sha256(body).hexdigest()[:32]
