"""Bounce addresses and suppression decisions (docs/protocol.md §22).

Every mail masd sends leaves with a bounce address of its case as envelope
sender: ``<case local part><delimiter>bounce-<tag>@<domain>``.  The tag is
``<n>-<mac>``: ``n`` names the outbound mail (its outbox row), ``mac`` is the
first 80 bits of HMAC-SHA256 over the case's key and ``n`` under the store's
secret, in lowercase base32 (16 letters and digits).  Local parts may be
lowercased on the way back, so the tag is lowercase and verified after
case folding; the case key is itself case-folded.  A tag verifies only for
the case it was made for.

Decisions this module makes:

* The 64-octet bound of docs/protocol.md §2 applies to the case part of a
  bounce address; the suffix is bounded by the tag's own grammar (at most 44
  characters), so every case can receive its bounces.
* The first delimiter character of ``server.recipient_delimiter`` joins the
  suffix when masd writes a bounce address; any of them is read.
* Suppression applies to the mails masd writes itself (acknowledgements,
  questions, resume notices), never to a master's ``mail.send``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "OWN_PURPOSES",
    "PREFIX",
    "BounceRecipient",
    "bounce_address",
    "make_tag",
    "own_mail_refusal",
    "split_bounce",
    "suppressed",
    "verify_tag",
]

#: A suffix that starts with this names a bounce address.
PREFIX: Final = "bounce-"
#: Letters of the MAC: 80 bits in base32.
MAC_CHARS: Final = 16
_TAG_RE = re.compile(r"([0-9]{1,18})-([a-z2-7]{16})")
#: The purposes of the mails masd writes itself (suppression applies to them).
OWN_PURPOSES: Final = frozenset({"acknowledge", "question", "resume"})


@dataclass(frozen=True, slots=True)
class BounceRecipient:
    """A recipient split at its bounce suffix: the case address, and the tag as written."""

    address: str
    tag: str


def _mac(key: bytes, case_key: str, n: int) -> str:
    text = f"masd-bounce\0{case_key.casefold()}\0{n}".encode()
    digest = hmac.new(key, text, hashlib.sha256).digest()
    return base64.b32encode(digest[:10]).decode("ascii").lower()


def make_tag(key: bytes, case_key: str, n: int) -> str:
    """The tag naming outbound mail ``n`` of case ``case_key``."""
    if n < 0:
        raise ValueError(f"mail number {n} is negative")
    return f"{n}-{_mac(key, case_key, n)}"


def verify_tag(key: bytes | None, case_key: str, tag: str) -> int | None:
    """The outbound mail ``tag`` names if it verifies for ``case_key``, else None.

    ``key`` None (the store has no secret yet: no mail ever left) verifies nothing.
    """
    if key is None:
        return None
    m = _TAG_RE.fullmatch(tag.casefold())
    if m is None:
        return None
    n = int(m.group(1))
    if hmac.compare_digest(_mac(key, case_key, n), m.group(2)):
        return n
    return None


def bounce_address(case_address: str, delimiter: str, tag: str) -> str:
    """The envelope sender of a mail of the case at ``case_address`` (docs/protocol.md §22)."""
    local, _, domain = case_address.rpartition("@")
    joint = delimiter[:1] or "+"
    return f"{local}{joint}{PREFIX}{tag}@{domain}"


def split_bounce(rcpt: str, delimiter: str) -> BounceRecipient | None:
    """``rcpt`` split at its bounce suffix, or None when it is no bounce address.

    Angle brackets are dropped; the address returned has no suffix, so it
    parses as the case address.  An empty delimiter disables bounce addresses.
    """
    if not delimiter:
        return None
    text = rcpt[1:-1] if rcpt.startswith("<") and rcpt.endswith(">") else rcpt
    local, at, domain = text.rpartition("@")
    if not at:
        return None
    if len(delimiter) == 1:  # the usual case: one character, no scan of each
        cut = local.find(delimiter)
    else:
        cut = min((i for i in map(local.find, delimiter) if i >= 0), default=-1)
    if cut <= 0:
        return None
    suffix = local[cut + 1 :]
    if suffix[: len(PREFIX)].lower() != PREFIX:
        return None
    return BounceRecipient(f"{local[:cut]}@{domain}", suffix[len(PREFIX) :])


def suppressed(until: float | None, now: float) -> bool:
    """Whether a suppression ending at ``until`` (None: none) holds at ``now``."""
    return until is not None and now < until


def own_mail_refusal(purpose: str, until: float | None, now: float) -> str | None:
    """``suppressed`` when masd's own mail (not a master's) goes to a suppressed address."""
    if purpose in OWN_PURPOSES and suppressed(until, now):
        return "suppressed"
    return None
