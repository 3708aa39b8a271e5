"""A masd.toml with one master type, ``ticket`` (mode ``callback``), for tests of one edge.

The endpoint is never reached (port 9); each test adds what it needs: server
lines (listeners, limits, hostname), lines for the ticket type, more types.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from masd.config import Config, load_config

_CONFIG = """\
[server]
database = "masd.db"
trusted_authserv_ids = ["mx.help.example"]
{server}

[domains."help.example".types.ticket]
role = "master"
modes = ["callback"]
{ticket}

[domains."help.example".types.ticket.endpoints.callback]
url = "http://127.0.0.1:9/mas/callback"
token_file = "callback.token"
deadline = "2h"
{types}
"""


def write_ticket_config(
    directory: Path,
    *,
    server: str = "",
    ticket: str = "",
    types: str = "",
    tokens: tuple[str, ...] = ("callback.token",),
) -> Config:
    """Write ``directory/masd.toml`` and a secret in each of ``tokens``; the loaded config."""
    for name in tokens:
        token = directory / name
        token.write_text(secrets.token_hex(16) + "\n")
        token.chmod(0o600)
    path = directory / "masd.toml"
    path.write_text(_CONFIG.format(server=server, ticket=ticket, types=types))
    return load_config(path)
