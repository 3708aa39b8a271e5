"""Values of a masd configuration: durations, listener addresses, peer URLs.

Each parser raises ValueError carrying the reason, which the checker puts
after the key path and the value refused.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from masd.config.model import Listen, TcpListen, TypeConfig, UnixListen, Webhook
from masd.config.names import is_host, show

_DURATION = re.compile(r"(?:([0-9]{1,9})d)?(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,9})s)?")
_UNITS: Final = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
DURATION_HINT: Final = "(30s, 15m, 2h, 3d)"


def parse_duration(text: str) -> float:
    """``"30s"``, ``"15m"``, ``"2h"``, ``"3d"`` (or a compound such as ``"1h30m"``) in seconds."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None or not any(match.groups()):
        raise ValueError(f"{show(text)} is not a duration {DURATION_HINT}")
    return float(
        sum(int(n) * size for n, (_, size) in zip(match.groups(), _UNITS, strict=True) if n)
    )


def format_duration(seconds: float) -> str:
    """The shortest duration text for ``seconds``: 5400 -> ``"1h30m"``."""
    rest = round(seconds)
    if rest <= 0:
        return "0s"
    parts = []
    for unit, size in _UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


_LISTEN_HINT: Final = "is not a listener (unix:/path, host:port or [ipv6]:port)"
_UNIX_PATH_MAX: Final = 107  # sun_path is 108 bytes including the final NUL


def parse_listen(text: str, *, base_dir: Path | None = None, min_port: int = 0) -> Listen:
    """``unix:/run/masd/lmtp.sock``, ``127.0.0.1:2424``, ``[::1]:2424`` or ``name:port``.

    Port 0 (the system picks one) is allowed for listeners; pass ``min_port=1``
    for an address masd connects to.  ValueError carries the reason.
    """
    if text.startswith("unix:"):
        return _parse_unix(text[len("unix:") :], base_dir)
    bracketed = re.fullmatch(r"\[([^\]]*)\]:([0-9]{1,5})", text)
    if bracketed:
        host, port_text = bracketed.groups()
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError(_LISTEN_HINT)
        except ValueError:
            raise ValueError(f"{_LISTEN_HINT}: {show(host)} is not an IPv6 address") from None
    else:
        plain = re.fullmatch(r"([^:\[\]]+):([0-9]{1,5})", text)
        if plain is None:
            if text.count(":") > 1:
                raise ValueError(f"{_LISTEN_HINT}: put an IPv6 address in brackets")
            raise ValueError(_LISTEN_HINT)
        host, port_text = plain.groups()
        if not is_host(host):
            raise ValueError(f"{_LISTEN_HINT}: {show(host)} is not a host name or address")
        host = host.lower()
    port = int(port_text)
    if not min_port <= port <= 65535:
        raise ValueError(f"has port {port}, not in {min_port}-65535")
    return TcpListen(host, port)


def _parse_unix(raw: str, base_dir: Path | None) -> UnixListen:
    if not raw or "\0" in raw:
        raise ValueError(_LISTEN_HINT)
    path = Path(raw)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if len(str(path).encode()) > _UNIX_PATH_MAX:
        raise ValueError(f"is longer than {_UNIX_PATH_MAX} bytes (the unix socket limit)")
    return UnixListen(path)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an absolute http(s) URL masd may talk to, or None."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "is not an http or https URL (it contains whitespace or control characters)"
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed "[" of an IPv6 host, a bracket elsewhere
        return "is not an absolute http or https URL"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "is not an absolute http or https URL"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (secrets live in token files)"
    if parts.fragment or url.endswith("#"):
        return "must not have a fragment"
    try:
        parts.port  # noqa: B018  (urlsplit checks the port only when asked)
    except ValueError:
        return "has a bad port"
    return None


def webhook_for(type_config: TypeConfig, url: str) -> Webhook | None:
    """The ``webhooks`` entry of ``type_config`` that allows ``url``, or None.

    docs/protocol.md §18: "A transfers webhook URL must have the same scheme, host and
    port as a configured ``webhooks.url`` and a path under its path (at a ``/``
    boundary); otherwise ``400 invalid-message``: a master cannot point masd at
    an arbitrary host."  Scheme and host compare case-insensitively, an absent
    port is the scheme's default, an empty path is ``/``.  A URL with
    credentials, a fragment, or a ``.``/``..`` path segment (also
    percent-encoded) matches nothing: such a path could leave the allowed tree
    once the server normalizes it.
    """
    return webhook_among(type_config.webhooks, url)


def webhook_among(webhooks: tuple[Webhook, ...], url: str) -> Webhook | None:
    """The entry of ``webhooks`` that allows ``url`` (see :func:`webhook_for`), or None."""
    wanted = _url_key(url)
    if wanted is None:
        return None
    for hook in webhooks:
        allowed = _url_key(hook.url)
        if allowed is None or allowed[:3] != wanted[:3]:
            continue
        base, path = allowed[3], wanted[3]
        if path == base or path.startswith(base if base.endswith("/") else base + "/"):
            return hook
    return None


def _url_key(url: str) -> tuple[str, str, int, str] | None:
    if url_problem(url) is not None:
        return None
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
    path = parts.path or "/"
    if any(segment in (".", "..") for segment in unquote(path).split("/")):
        return None
    return scheme, (parts.hostname or "").lower(), port, path
