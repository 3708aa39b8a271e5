"""A slave-role configuration for black-box tests (docs/protocol.md §13, §18).

``write_slave_config`` writes ``masd.toml`` and its token files (mode 0600),
in the style of :func:`support.masd_process.write_master_config`:

- type ``case`` of ``help.example`` in the slave role, owned by the master at
  ``master_url``, with one ``webhooks`` entry at ``webhook_url`` (fields
  ``phone``) and the given default ``policy`` and ``send_cap``;
- a second master ("the other master", its own secret) that owns type
  ``order`` of ``help.example`` and type ``case`` of ``other.example``: a
  master of another type or another domain, for the ``403 forbidden`` checks.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from support.masd_process import DOMAIN, server_section, write_secret

OTHER_DOMAIN = "other.example"


@dataclass(frozen=True)
class SlaveSetup:
    """A written slave-role configuration and what a test needs to talk to masd."""

    config: Path
    lmtp_port: int
    http_port: int
    admin_token: str
    master_token: str
    other_master_token: str
    webhook_token: str
    webhook_url: str

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def messages_url(self) -> str:
        return f"{self.http_url}/mas/v0.1/messages"


def _toml_policy(autonomous_send: bool, transfers: str) -> str:
    target = '"block"' if transfers == "block" else "{ webhook = " + json.dumps(transfers) + " }"
    return f"{{ autonomous_send = {'true' if autonomous_send else 'false'}, transfers = {target} }}"


def write_slave_config(
    directory: Path,
    *,
    master_url: str,
    webhook_url: str,
    smtp_port: int,
    other_master_url: str = "http://127.0.0.1:9/other",
    autonomous_send: bool = False,
    transfers: str = "block",
    per_case: int = 20,
    per_recipient_per_day: int = 10,
    retry_for: str = "1h",
    require_dmarc_for_handoff: bool = True,
) -> SlaveSetup:
    """``directory/masd.toml``: slave type ``case`` of ``help.example`` and the other master.

    ``transfers`` is the type's default: ``"block"`` or a webhook URL (which
    must lie under ``webhook_url``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    tokens = {
        "admin": "admin-" + secrets.token_hex(16),
        "crm": "crm-" + secrets.token_hex(16),
        "other": "other-" + secrets.token_hex(16),
        "transfer": "transfer-" + secrets.token_hex(16),
    }
    for name, value in tokens.items():
        write_secret(directory / "secrets" / f"{name}.token", value)
    server, lmtp_port, http_port = server_section(smtp_port, retry_for)
    dmarc = "true" if require_dmarc_for_handoff else "false"
    text = (
        server
        + f"""
[domains."{DOMAIN}".types.case]
role = "slave"
master = {{ url = "{master_url}", token_file = "secrets/crm.token" }}
policy = {_toml_policy(autonomous_send, transfers)}
require_dmarc_for_handoff = {dmarc}
send_cap = {{ per_case = {per_case}, per_recipient_per_day = {per_recipient_per_day} }}

[[domains."{DOMAIN}".types.case.webhooks]]
url = "{webhook_url}"
token_file = "secrets/transfer.token"
fields = ["phone"]

[domains."{DOMAIN}".types.order]
role = "slave"
master = {{ url = "{other_master_url}", token_file = "secrets/other.token" }}

[domains."{OTHER_DOMAIN}".types.case]
role = "slave"
master = {{ url = "{other_master_url}", token_file = "secrets/other.token" }}
"""
    )
    config = directory / "masd.toml"
    config.write_text(text)
    return SlaveSetup(
        config,
        lmtp_port,
        http_port,
        tokens["admin"],
        tokens["crm"],
        tokens["other"],
        tokens["transfer"],
        webhook_url,
    )
