"""What a reload may not change: the settings a running masd applied once, at start."""

from __future__ import annotations

from typing import Final

from masd.config.model import Config

#: ``[server]`` keys bound at start (listeners, the store, the relay session's
#: name, the listeners' limits and the pid file): a reload that changes one is refused.
RESTART_KEYS: Final = (
    "lmtp",
    "http",
    "policy",
    "milter",
    "mcp",
    "database",
    "smtp_relay",
    "hostname",
    "max_message_bytes",
    "max_lmtp_sessions",
    "max_http_connections",
    "pid_file",
)


def restart_needed(running: Config, new: Config) -> list[str]:
    """One refusal per ``RESTART_KEYS`` setting ``new`` changes, naming its key."""
    return [
        f"server.{key} changed: restart masd to apply"
        for key in RESTART_KEYS
        if getattr(running.server, key) != getattr(new.server, key)
    ]
