"""Calling a running masd's admin API from the command line (``masd queue retry|drop``).

The address is the config's ``server.http`` (a wildcard host is reached on
loopback, a unix socket through its path) and the secret its
``server.admin_token_file``.  :class:`NotRunning` says no masd answered
there, so the caller may act on the store itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import httpx

from masd.config import Config, TcpListen

TIMEOUT: Final = 30.0
_WILDCARDS: Final = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104


class NotRunning(Exception):
    """No masd answered at the configured HTTP address."""


class AdminError(Exception):
    """The admin API cannot be called: no admin secret configured."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]


def base_url(config: Config) -> tuple[str, httpx.HTTPTransport | None]:
    """The URL of masd's HTTP listener, and the transport to reach a unix socket."""
    listen = config.server.http
    if isinstance(listen, TcpListen):
        host = _WILDCARDS.get(listen.host, listen.host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{listen.port}", None
    return "http://masd", httpx.HTTPTransport(uds=str(listen.path))


def call(config: Config, method: str, path: str) -> Answer:
    """``method path`` with the admin secret; :class:`NotRunning` if nobody listens."""
    token = config.server.admin_token
    if token is None:
        raise AdminError("no admin secret is configured (server.admin_token_file)")
    url, transport = base_url(config)
    try:
        with httpx.Client(base_url=url, transport=transport, timeout=TIMEOUT) as client:
            response = client.request(method, path, headers={"Authorization": f"Bearer {token}"})
    except (httpx.ConnectError, FileNotFoundError) as exc:
        raise NotRunning(f"no masd answered at {url}{path}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise AdminError(f"{method} {url}{path}: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        body = {"ok": False, "error": "not-json", "detail": response.text[:300]}
    return Answer(response.status_code, body if isinstance(body, dict) else {"body": body})
