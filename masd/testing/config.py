"""masd configurations for test rigs: the ``[server]`` table, and a master-role setup.

Every rig (the tests, ``masd demo``, the conformance runner) serves domain
:data:`DOMAIN` and trusts the Authentication-Results of :data:`AUTHSERV_ID`,
with listeners on loopback and secrets in ``secrets/<name>.token`` (mode
0600) beside ``masd.toml``; the paths in the file are relative to it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from masd.testing.files import to_toml, write_secrets
from masd.testing.net import free_ports

__all__ = [
    "AUTHSERV_ID",
    "DOMAIN",
    "MasterSetup",
    "server_section",
    "server_table",
    "write_config",
    "write_master_config",
]

DOMAIN = "help.example"
AUTHSERV_ID = "mx.help.example"


def server_table(*, lmtp_port: int, http_port: int, smtp_port: int, **extra: Any) -> dict[str, Any]:
    """``[server]`` on loopback: LMTP and HTTP at the given ports (0: any), the store
    ``masd.db``, the relay at ``smtp_port``, the admin secret; ``extra`` keys added."""
    return {
        "lmtp": f"127.0.0.1:{lmtp_port}",
        "http": f"127.0.0.1:{http_port}",
        "database": "masd.db",
        "smtp_relay": f"127.0.0.1:{smtp_port}",
        "trusted_authserv_ids": [AUTHSERV_ID],
        "admin_token_file": "secrets/admin.token",
        **extra,
    }


def write_config(directory: Path, doc: Mapping[str, Any], tokens: Mapping[str, str]) -> Path:
    """``directory/masd.toml`` from ``doc`` and ``secrets/<name>.token`` per token; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    write_secrets(directory / "secrets", tokens)
    path = directory / "masd.toml"
    path.write_text(to_toml(doc), encoding="utf-8")
    return path


def server_section(smtp_port: int, retry_for: str) -> tuple[str, int, int]:
    """The ``[server]`` table of a test config on free loopback ports, and the ports."""
    lmtp_port, http_port = free_ports(2)
    table = server_table(
        lmtp_port=lmtp_port, http_port=http_port, smtp_port=smtp_port, retry_for=retry_for
    )
    return to_toml({"server": table}).lstrip("\n"), lmtp_port, http_port


@dataclass(frozen=True)
class MasterSetup:
    """A written master-role configuration and what a test needs to talk to masd."""

    config: Path
    lmtp_port: int
    http_port: int
    admin_token: str
    endpoint_token: str

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def messages_url(self) -> str:
        return f"{self.http_url}/mas/v0.1/messages"


def write_master_config(
    directory: Path,
    *,
    endpoint_url: str,
    smtp_port: int,
    deadline: str = "1h",
    modes: Sequence[str] = ("callback", "chat"),
    fields: Sequence[str] = ("phone", "time"),
    retry_for: str = "1h",
) -> MasterSetup:
    """``directory/masd.toml``: type ``ticket`` (master) of :data:`DOMAIN`, on free ports.

    ``callback`` goes to ``endpoint_url``; every other mode in ``modes`` is
    listed without an endpoint.
    """
    tokens = {
        "admin": "admin-" + secrets.token_hex(16),
        "callback": "callback-" + secrets.token_hex(16),
    }
    lmtp_port, http_port = free_ports(2)
    ticket: dict[str, Any] = {"role": "master", "modes": list(modes)}
    if "callback" in modes:
        ticket["endpoints"] = {
            "callback": {
                "url": endpoint_url,
                "token_file": "secrets/callback.token",
                "deadline": deadline,
                "fields": list(fields),
            }
        }
    server = server_table(
        lmtp_port=lmtp_port, http_port=http_port, smtp_port=smtp_port, retry_for=retry_for
    )
    doc = {"server": server, "domains": {DOMAIN: {"types": {"ticket": ticket}}}}
    config = write_config(directory, doc, tokens)
    return MasterSetup(config, lmtp_port, http_port, tokens["admin"], tokens["callback"])
