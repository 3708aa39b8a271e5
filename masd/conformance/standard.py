"""The configuration every flow starts from, and how a flow's ``config`` patches it."""

from __future__ import annotations

import copy
from typing import Any

from masd.testing.config import DOMAIN, server_table

__all__ = ["DOMAIN", "apply_patch", "merge", "standard_config"]


def standard_config(
    *, lmtp_port: int, http_port: int, smtp_port: int, peer_urls: dict[str, str]
) -> dict[str, Any]:
    """The configuration every flow starts from (docs/protocol.md §18 keys), as a TOML-shaped dict.

    Master type ``ticket`` (modes callback, chat, sms; callback and sms have
    endpoints, chat is listed without one); slave type ``case`` owned by the
    ``master`` peer with a ``webhook``; slave type ``order`` owned by the
    ``other`` master.  Secrets are in ``secrets/<peer>.token``.
    """
    server = server_table(
        lmtp_port=lmtp_port, http_port=http_port, smtp_port=smtp_port, retry_for="1h"
    )
    types = {
        "ticket": _ticket(peer_urls),
        "case": {
            "role": "slave",
            "master": {"url": peer_urls["master"], "token_file": "secrets/master.token"},
            "policy": {"autonomous_send": False, "transfers": "block"},
            "webhooks": [
                {
                    "url": peer_urls["webhook"],
                    "token_file": "secrets/webhook.token",
                    "fields": ["phone"],
                }
            ],
        },
        "order": {
            "role": "slave",
            "master": {"url": peer_urls["other"], "token_file": "secrets/other.token"},
        },
    }
    return {"server": server, "domains": {DOMAIN: {"types": types}}}


def _ticket(peer_urls: dict[str, str]) -> dict[str, Any]:
    """Master type ``ticket``: callback and sms at their peers, chat with no endpoint."""
    return {
        "role": "master",
        "modes": ["callback", "chat", "sms"],
        "endpoints": {
            "callback": {
                "url": peer_urls["callback"],
                "token_file": "secrets/callback.token",
                "deadline": "1h",
                "fields": ["phone", "time"],
            },
            "sms": {
                "url": peer_urls["sms"],
                "token_file": "secrets/sms.token",
                "deadline": "1h",
                "fields": ["phone"],
            },
        },
    }


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` merged into a copy of ``base``: objects merge, null deletes, the rest replaces."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_patch(config: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A flow's ``config``: ``server`` patches [server], ``types`` the types of help.example."""
    out = copy.deepcopy(config)
    if "server" in patch:
        out["server"] = merge(out["server"], patch["server"])
    if "types" in patch:
        domain = out["domains"][DOMAIN]
        domain["types"] = merge(domain["types"], patch["types"])
    return out
