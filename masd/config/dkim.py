"""``domains.D.dkim``: one key table, or an array of them signing together.

Each key file is read and loaded when the configuration is (``masd
check-config`` says what is wrong with it, by key path), with :func:`load_key`,
the one place that decides whether a key can sign: RSA of at least
:data:`MIN_RSA_BITS` bits or Ed25519, in PEM, without a passphrase.
"""

from __future__ import annotations

import re
from typing import Final, TypeAlias

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from masd.config.checker import Checker as _Checker
from masd.config.model import Dkim
from masd.config.names import join as _join
from masd.config.names import show as _show

_DKIM_KEYS: Final = frozenset({"selector", "key_file"})
#: RSA keys shorter than this are refused (RFC 8301 §3.2: at least 1024 bits).
MIN_RSA_BITS: Final = 1024

SigningKey: TypeAlias = rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey

_PEM_KEY = re.compile(
    rb"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----\s+[A-Za-z0-9+/=\s:,-]+?"
    rb"-----END \1PRIVATE KEY-----"
)


class UnusableKey(ValueError):
    """A key that cannot sign DKIM; the text says why, after the file's name."""


def load_key(data: bytes) -> SigningKey:
    """The private key in ``data`` (PEM: RSA as PKCS#1 or PKCS#8, Ed25519 as PKCS#8).

    Raises :class:`UnusableKey` saying why it cannot sign.
    """
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # cryptography's answer for a key that needs a password
        raise UnusableKey("is encrypted: masd reads keys without a passphrase") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise UnusableKey(f"is not a usable key: {exc}") from exc
    if isinstance(loaded, rsa.RSAPrivateKey):
        if loaded.key_size < MIN_RSA_BITS:
            raise UnusableKey(
                f"is an RSA key of {loaded.key_size} bits; at least {MIN_RSA_BITS} needed"
            )
        return loaded
    if isinstance(loaded, ed25519.Ed25519PrivateKey):
        return loaded
    kind = type(loaded).__name__.lstrip("_")
    raise UnusableKey(f"is a {kind}; DKIM signs with RSA or Ed25519")


def _parse_dkim_keys(check: _Checker, raw: object, path: str) -> tuple[Dkim, ...]:
    """One key (a table) or several signing together (an array of tables, e.g. RSA + Ed25519)."""
    if not isinstance(raw, list):
        one = _parse_dkim(check, raw, path)
        return () if one is None else (one,)
    if not raw:
        check.error(path, "empty: give one key table, or leave dkim out")
    keys = [_parse_dkim(check, item, f"{path}[{i}]") for i, item in enumerate(raw)]
    found = tuple(key for key in keys if key is not None)
    selectors = [key.selector for key in found]
    for i, selector in enumerate(selectors):
        if selector in selectors[:i]:
            check.error(f"{path}[{i}].selector", f"{_show(selector)} is used twice")
    return found


def _parse_dkim(check: _Checker, raw: object, path: str) -> Dkim | None:
    table = check.table(raw, path, _DKIM_KEYS)
    if not isinstance(raw, dict):
        return None
    selector = check.require(table, path, "selector", str, "")
    if "selector" in table and isinstance(table["selector"], str):
        labels = selector.split(".")
        if not all(
            re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels
        ):
            check.error(_join(path, "selector"), f"{_show(selector)} is not a DNS label")
    key_text = check.require(table, path, "key_file", str, "")
    key = b""
    if "key_file" in table and isinstance(table["key_file"], str):
        data = check.read_file(_join(path, "key_file"), key_text)
        if data is not None:
            shown = _show(str(check.resolve(key_text)))
            if _PEM_KEY.search(data) is None:
                check.error(_join(path, "key_file"), f"{shown} is not a PEM private key")
            else:
                try:
                    load_key(data)
                except UnusableKey as exc:
                    check.error(_join(path, "key_file"), f"{shown} {exc}")
            key = data
    return Dkim(selector=selector, key_file=check.resolve(key_text or "."), key=key)
