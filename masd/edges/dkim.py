"""DKIM signatures (RFC 6376) computed by OpenSSL: RSA-SHA256 and Ed25519-SHA256 (RFC 8463).

A domain may have several keys (``domains.D.dkim`` as an array): the mail
then carries one ``DKIM-Signature`` per key, in configuration order, each
over the message as composed (none covers another).  Canonicalization is
relaxed/relaxed; the header is built, folded and hashed the way dkimpy
builds it (same tags in the same order), so a signature from here equals
dkimpy's for the same key, message and time (tests/test_dkim.py compares
them byte for byte and verifies every signature with dkimpy).  dkimpy signs
RSA in pure Python (about 9 ms per signature for a 2048-bit key); OpenSSL
through ``cryptography`` takes a fraction of a millisecond.

Signing is CPU work: callers run :func:`sign` off the event loop's thread.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from masd.config import Dkim
from masd.config.dkim import SigningKey, UnusableKey, load_key
from masd.core.errors import MasdError

__all__ = ["SIGNED_HEADERS", "DkimSignError", "Signer", "load_signer", "sign"]

#: Headers a signature covers, when the message has them.
SIGNED_HEADERS: Final = (
    "From",
    "To",
    "Subject",
    "Date",
    "Message-ID",
    "In-Reply-To",
    "References",
    "Auto-Submitted",
    "MIME-Version",
    "Content-Type",
)
_SIGNED: Final = tuple(h.lower().encode("ascii") for h in SIGNED_HEADERS)

_LINE = re.compile(rb"\r?\n")
_HEADER_END = re.compile(rb"(?:^|\r?\n)\r?\n")
_FIELD = re.compile(rb"([\x21-\x7e]+?):")
#: A run of whitespace that is not already one space (one space is left alone: faster).
_WSP = re.compile(rb"\t[\t ]*| [\t ]+")
_WSP_EOL = re.compile(rb"[\t ]+\r\n")
_NAME: Final = b"DKIM-Signature"
#: Makes the ``b=`` tag, last, too long to share a line: folding then never
#: changes what precedes it when the real value replaces the placeholder.
_PLACEHOLDER: Final = b"0" * 60


class DkimSignError(MasdError):
    """The message could not be DKIM-signed (bad key or message)."""

    code = "dkim-failed"


@dataclass(frozen=True)
class Signer:
    """One loaded key of one domain: what a ``DKIM-Signature`` is made with."""

    domain: bytes
    selector: bytes
    algorithm: bytes  # b"rsa-sha256" or b"ed25519-sha256"
    key: SigningKey

    def describe(self) -> str:
        return f"{self.domain.decode()} (selector {self.selector.decode()})"


def load_signer(key: Dkim, domain: str) -> Signer:
    """``key`` (PEM: RSA in PKCS#1 or PKCS#8, Ed25519 in PKCS#8) ready to sign for ``domain``."""
    where = f"DKIM signing for {domain} (selector {key.selector})"
    try:
        names = domain.encode("ascii"), key.selector.encode("ascii")
    except UnicodeError as exc:
        raise DkimSignError(f"{where}: names must be ASCII (A-labels): {exc}") from exc
    try:
        loaded = load_key(key.key)
    except UnusableKey as exc:
        raise DkimSignError(f"{where}: {key.key_file} {exc}") from exc
    algorithm = b"rsa-sha256" if isinstance(loaded, rsa.RSAPrivateKey) else b"ed25519-sha256"
    return Signer(*names, algorithm, loaded)


def sign(message: bytes, signers: Sequence[Signer], now: float) -> bytes:
    """``message`` with one ``DKIM-Signature`` per signer on top, the first signer's first."""
    if not signers:
        return message
    headers, body = _parse(message)
    digest = base64.b64encode(hashlib.sha256(_canonical_body(body)).digest())
    chosen = _select(headers)
    if not any(name == b"from" for name, _ in chosen):
        raise DkimSignError("DKIM signing: the message has no From header")
    signed = b"".join(name + b":" + _canonical_value(value) for name, value in chosen)
    h_tag = b" : ".join(name for name, _ in chosen)
    stamp = str(int(now)).encode("ascii")
    out = [_signature(s, signed, h_tag, digest, stamp) for s in signers]
    return b"".join(out) + message


def _signature(s: Signer, signed: bytes, h_tag: bytes, digest: bytes, stamp: bytes) -> bytes:
    fields = [
        (b"v", b"1"),
        (b"a", s.algorithm),
        (b"c", b"relaxed/relaxed"),
        (b"d", s.domain),
        (b"i", b"@" + s.domain),
        (b"q", b"dns/txt"),
        (b"s", s.selector),
        (b"t", stamp),
        (b"h", h_tag),
        (b"bh", digest),
        (b"b", _PLACEHOLDER),
    ]
    unsigned = _fold(_join(fields), len(_NAME))[: -len(_PLACEHOLDER)]  # ends in "b="
    # The signature header itself is hashed last, with b= empty and no CRLF.
    data = signed + b"dkim-signature:" + _canonical_value(b" " + unsigned).rstrip()
    try:
        if isinstance(s.key, rsa.RSAPrivateKey):
            value = s.key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        else:  # RFC 8463: Ed25519 signs the SHA-256 hash of the data
            value = s.key.sign(hashlib.sha256(data).digest())
    except ValueError as exc:
        raise DkimSignError(f"DKIM signing for {s.describe()}: {exc}") from exc
    fields[-1] = (b"b", base64.b64encode(value))
    return _NAME + b": " + _fold(_join(fields) + b"\r\n", len(_NAME))


def _join(fields: list[tuple[bytes, bytes]]) -> bytes:
    return b"; ".join(k + b"=" + v for k, v in fields)


def _parse(message: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Header fields (name, raw value with its CRLF) and the body with CRLF line ends."""
    end = _HEADER_END.search(message)
    if end is None:
        head, body = message, b""
    else:
        head, body = message[: end.start()], message[end.end() :]
    headers: list[tuple[bytes, bytes]] = []
    for line in _LINE.split(head) if head else ():
        if not line:  # the CRLF that ends a message of headers only
            continue
        if line[:1] in (b" ", b"\t") and headers:
            name, value = headers[-1]
            headers[-1] = (name, value + line + b"\r\n")
        elif (field := _FIELD.match(line)) is not None:
            headers.append((field.group(1), line[field.end() :] + b"\r\n"))
        elif not line.startswith(b"From "):
            raise DkimSignError(f"DKIM signing: not a header line: {line[:60]!r}")
    if body.count(b"\n") != body.count(b"\r\n"):
        body = _LINE.sub(b"\r\n", body)
    return headers, body


def _select(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The last field of each signed name the message has (the one a receiver checks)."""
    last: dict[bytes, tuple[bytes, bytes]] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in _SIGNED:
            last[lower] = (lower, value)
    return [last[name] for name in _SIGNED if name in last]


def _canonical_value(value: bytes) -> bytes:
    """Relaxed header canonicalization of one value (RFC 6376 §3.4.2), CRLF ended."""
    value = value.strip()
    if b"\n" in value or b"\t" in value or b"  " in value:
        value = _WSP.sub(b" ", _LINE.sub(b"", value))
    return value + b"\r\n"


def _canonical_body(body: bytes) -> bytes:
    """Relaxed body canonicalization (RFC 6376 §3.4.4); an empty body hashes as empty."""
    body = _WSP.sub(b" ", _WSP_EOL.sub(b"\r\n", body))
    end = len(body)
    while body.endswith(b"\r\n", 0, end):
        end -= 2
    return body[:end] + b"\r\n" if end else b""


def _fold(value: bytes, namelen: int) -> bytes:
    """Fold at spaces to lines of at most 72 columns, the field name counted (as dkimpy)."""
    width = 72 - namelen
    if len(value) <= width:
        return value
    if len(value) - value.rfind(b"\r\n") == 2 and len(value) <= width + 2:
        return value
    done = b""
    while len(value) > width:
        space = value[:width].rfind(b" ")
        if space == -1:
            done += value[:width] + b"\r\n "
            value = value[width:]
        else:
            done += value[:space] + b"\r\n "
            value = value[space + 1 :]
        width = 71
    if value == b"\r\n" and done:
        # dkimpy would leave a line of one space here; the same header without it.
        return done[:-3] + value
    return done + value
