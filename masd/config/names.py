"""Names in a masd configuration: domains, hosts, key paths, and how values are shown.

Pure functions on strings, shared by the other modules of :mod:`masd.config`.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Iterable
from datetime import date, datetime, time
from typing import Final

_LDH_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def normalize_domain(name: str) -> str:
    """A domain in lowercase A-label form; ValueError (with the reason) when it is not one."""
    if not name or name != name.strip() or name.endswith("."):
        raise ValueError("is not a domain name")
    try:
        ascii_name = name.lower().encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError("is not a valid IDNA domain name") from None
    if len(ascii_name) > 253:
        raise ValueError("is longer than 253 octets")
    for label in ascii_name.split("."):
        if not _LDH_LABEL.fullmatch(label):
            raise ValueError(f"has a bad label {show(label)} (letters, digits and inner hyphens)")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise ValueError(f"has a bad A-label {show(label)}") from None
    return ascii_name


def ascii_host_name(text: str) -> str:
    """``text`` as a lowercase ASCII host name (dot-separated letter-digit-hyphen labels).

    ValueError when it is not one: a non-ASCII name, an empty or over-long
    label, a character other than letters, digits, ``-`` and inner dots.
    """
    if not text.isascii():
        raise ValueError("is not ASCII")
    return normalize_domain(text)


def is_host(host: str) -> bool:
    """An IPv4 address or a host name (IPv6 addresses are checked by :func:`is_ipv6`)."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        pass
    else:
        return True
    if re.fullmatch(r"[0-9.]+", host):  # looks numeric but is not a valid IPv4 address
        return False
    try:
        normalize_domain(host)
    except ValueError:
        return False
    return True


def is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


# Grammar of docs/protocol.md §2: type = ALPHA *31(ALPHA / DIGIT / "-"), mode = ALPHA *15(...),
# id = 1*64(ALPHA / DIGIT / "-" / "_" / "."), case-insensitive and stored lowercase.
TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
MODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,15}")
ID_CHARS = re.compile(r"[A-Za-z0-9_.-]*")
FIELD_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ID_DIGITS_ROOM: Final = 10  # ids are <id_prefix><n>; leave room for n up to 10 digits
TYPE_ID_MAX: Final = (
    47  # docs/protocol.md §2: "type=id" over 47 octets does not fit with a 16-char mode
)


# --------------------------------------------------------------------------- key paths

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def seg(key: str) -> str:
    """A key as it appears in a path: bare when TOML allows it, else double-quoted."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def join(path: str, key: str) -> str:
    """``path`` and one more key, in TOML syntax: ``domains."help.example".types``."""
    return f"{path}.{seg(key)}" if path else seg(key)


def show(value: object) -> str:
    """A value as it appears in an error message (secrets are never passed here)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 80 else value[:77] + "..."
        return json.dumps(text, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, datetime | date | time):
        return f"{value.isoformat()} (a date/time)"
    return repr(value)


def did_you_mean(word: object, choices: Iterable[str], *, quote: bool = False) -> str:
    """``', did you mean x?'`` for the choice closest to a misspelt ``word``, or ``""``.

    The one choice that holds ``word`` whole (``per_day`` ->
    ``per_recipient_per_day``), else the closest by difflib's ratio, at least
    0.6 (``mdoes`` -> ``modes``, ``max_mesage_bytes`` -> ``max_message_bytes``);
    a word near nothing gets no suggestion rather than a wild guess.  Keys are
    shown as in a key path, values (``quote=True``) as TOML strings.
    """
    if not isinstance(word, str) or not word:
        return ""
    options = sorted(choices)
    lower = word.lower()
    holding = [option for option in options if len(lower) >= 3 and lower in option.lower()]
    found = holding if len(holding) == 1 else []
    for spelling in dict.fromkeys((word, lower)):
        found = found or difflib.get_close_matches(spelling, options, n=1, cutoff=0.6)
    if not found or found[0] == word:
        return ""
    return f", did you mean {show(found[0]) if quote else seg(found[0])}?"
