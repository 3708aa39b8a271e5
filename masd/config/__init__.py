"""masd configuration: the TOML file of docs/protocol.md §18, loaded into frozen values.

``load_config`` reads the file and every secret it names, validates every key
and returns a :class:`Config`, or raises :class:`ConfigErrors` holding *all*
the errors found (never only the first).  Each error names its key path in
TOML syntax, e.g. ``domains."help.example".types.ticket.role``, and the value
refused; a misspelt key gets the nearest known key suggested.  Things that
work but are probably not what the operator wants (a secret file readable by
others, a mode with no endpoint) are warnings in ``Config.warnings``.

Relative paths (token files, DKIM keys, the database, unix sockets) are
relative to the directory of the configuration file.  Secrets are kept out of
``repr`` so a logged config never shows them.

The modules: :mod:`~masd.config.model` (the frozen values),
:mod:`~masd.config.names` and :mod:`~masd.config.values` (grammar of names,
durations, listeners, URLs), :mod:`~masd.config.checker` (error collection),
:mod:`~masd.config.load`, :mod:`~masd.config.domains` (domain tables and files),
:mod:`~masd.config.server`,
:mod:`~masd.config.casetypes` and :mod:`~masd.config.dkim` (the file, table by
table) and :mod:`~masd.config.summary` (``check-config``'s output).
"""

from __future__ import annotations

from masd.config.load import load_config, parse_config, pid_file_of
from masd.config.model import (
    DEFAULT_PATH,
    Config,
    ConfigErrors,
    Dkim,
    DomainConfig,
    Endpoint,
    Listen,
    MasterPeer,
    Policy,
    SendCap,
    ServerConfig,
    Signing,
    TcpListen,
    TypeConfig,
    UnixListen,
    Webhook,
)
from masd.config.names import normalize_domain
from masd.config.summary import format_summary
from masd.config.values import (
    DURATION_HINT,
    format_duration,
    parse_duration,
    parse_listen,
    webhook_for,
)

__all__ = [
    "DEFAULT_PATH",
    "DURATION_HINT",
    "Config",
    "ConfigErrors",
    "Dkim",
    "DomainConfig",
    "Endpoint",
    "Listen",
    "MasterPeer",
    "Policy",
    "SendCap",
    "ServerConfig",
    "Signing",
    "TcpListen",
    "TypeConfig",
    "UnixListen",
    "Webhook",
    "format_duration",
    "format_summary",
    "load_config",
    "normalize_domain",
    "parse_config",
    "parse_duration",
    "parse_listen",
    "pid_file_of",
    "webhook_for",
]
