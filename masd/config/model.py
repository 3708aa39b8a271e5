"""The loaded configuration: frozen values, secrets kept out of ``repr``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from masd.config.names import normalize_domain
from masd.core.errors import ConfigError, MasdError

DEFAULT_PATH: Final = Path("/etc/masd/masd.toml")


@dataclass(frozen=True)
class TcpListen:
    """A TCP address; ``host`` is kept without IPv6 brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class UnixListen:
    """A unix-domain socket path (absolute once loaded)."""

    path: Path

    def __str__(self) -> str:
        return f"unix:{self.path}"


Listen = TcpListen | UnixListen


@dataclass(frozen=True)
class SendCap:
    per_case: int = 20
    per_recipient_per_day: int = 10


@dataclass(frozen=True)
class Policy:
    """A slave type's default case policy; ``transfers`` is "block" or a webhook URL."""

    autonomous_send: bool = False
    transfers: str = "block"


@dataclass(frozen=True)
class Signing:
    """A peer's signing secrets (the keys of its ``whsec_`` lines) and whether it must sign."""

    keys: tuple[bytes, ...] = field(default=(), repr=False)
    required: bool = False


#: A peer without signing secrets.
NO_SIGNING: Final = Signing()


@dataclass(frozen=True)
class Endpoint:
    """The mode endpoint of a master type: where ``handoff.request`` goes."""

    domain: str
    type: str
    mode: str
    url: str
    token: str = field(repr=False)
    deadline: float
    fields: tuple[str, ...]
    signing: Signing = NO_SIGNING


@dataclass(frozen=True)
class MasterPeer:
    """The outside master of a slave type."""

    domain: str
    type: str
    url: str
    token: str = field(repr=False)
    signing: Signing = NO_SIGNING


@dataclass(frozen=True)
class Webhook:
    """A place a slave type's transfers policy may point at."""

    domain: str
    type: str
    url: str
    token: str = field(repr=False)
    fields: tuple[str, ...]
    signing: Signing = NO_SIGNING


@dataclass(frozen=True)
class TypeConfig:
    name: str
    role: str
    modes: tuple[str, ...]
    id_prefix: str
    acknowledge: bool
    require_dmarc_for_handoff: bool
    send_cap: SendCap
    endpoints: Mapping[str, Endpoint]
    master: MasterPeer | None
    policy: Policy
    webhooks: tuple[Webhook, ...]
    #: Seconds a case without an open handoff is kept after its last thread entry.
    retain: float = 400 * 86400.0


@dataclass(frozen=True)
class Dkim:
    selector: str
    key_file: Path
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class DomainConfig:
    name: str
    dkim_keys: tuple[Dkim, ...]
    types: Mapping[str, TypeConfig]

    @property
    def dkim(self) -> Dkim | None:
        """The first DKIM key (of one, or of an RSA and an Ed25519 key signing together)."""
        return self.dkim_keys[0] if self.dkim_keys else None


@dataclass(frozen=True)
class PostgresDatabase:
    """A PostgreSQL store: its libpq URI (never holding a password) and the password, if
    ``server.database_password_file`` gives one (else libpq's own means: ``.pgpass``,
    ``PGPASSFILE``, peer authentication)."""

    uri: str
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.uri


#: ``server.database``: an SQLite file, or a PostgreSQL database several hosts share.
Database = Path | PostgresDatabase


def sqlite_path(database: Database, what: str) -> Path:
    """The SQLite file ``database`` is; refused, naming ``what``, for a PostgreSQL store."""
    if isinstance(database, Path):
        return database
    raise MasdError(
        f"{what} needs an SQLite store; server.database is {database}", code="store-unavailable"
    )


@dataclass(frozen=True)
class ServerConfig:
    lmtp: Listen
    http: Listen
    policy: Listen | None
    milter: Listen | None
    public_url: str
    database: Database
    smtp_relay: TcpListen
    trusted_authserv_ids: tuple[str, ...]
    trusted_hosts: tuple[str, ...]
    admin_token: str | None = field(repr=False)
    recipient_delimiter: str
    max_message_bytes: int
    retry_for: float
    hostname: str
    max_lmtp_sessions: int = 100
    max_http_connections: int = 1000
    #: Event-feed followers at once (SSE streams, held long polls); read at each request.
    max_followers: int = 100
    #: Where ``<domain>.toml`` files are read from; a missing directory is an
    #: error only when ``domains_dir`` was set.
    domains_dir: Path | None = None
    domains_dir_set: bool = False
    claim_timeout: float = 30.0
    max_policy_connections: int = 100
    max_milter_connections: int = 100
    log_format: str = "text"  # or "json": one object a line
    #: Serve the operator console at ``/console/`` on the HTTP listener.
    console: bool = False
    #: Seconds masd waits for a peer's answer to a contract message (then: retried).
    peer_timeout: float = 10.0
    #: how long a permanently failed recipient is suppressed (docs/protocol.md §22)
    suppress_for: float = 30 * 86400.0
    #: Where ``masd serve`` writes its pid and each reload's outcome, which ``masd reload``
    #: reads (``serve --pid-file`` wins); None: nowhere.
    pid_file: Path | None = None
    #: Where MCP (streamable HTTP, at ``/mcp``) is served; None: off.
    mcp: Listen | None = None


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    domains: Mapping[str, DomainConfig]
    source: str
    warnings: tuple[str, ...]

    def type_for(self, domain: str, type: str) -> TypeConfig | None:
        """The configured type ``type`` of ``domain`` (both case-insensitive), or None."""
        # The keys are already normalized (and normalizing is idempotent), so a
        # domain spelled as a key is that key; only other spellings need IDNA.
        found = self.domains.get(domain)
        if found is None:
            try:
                found = self.domains.get(normalize_domain(domain))
            except ValueError:
                return None
        return None if found is None else found.types.get(type.lower())


class ConfigErrors(MasdError):
    """Every error found in one configuration; ``errors`` lists them in file order."""

    code = "bad-config"

    def __init__(self, errors: list[ConfigError], *, source: str = "<config>") -> None:
        self.errors = list(errors)
        self.source = source
        count = len(self.errors)
        lines = "\n".join(str(error) for error in self.errors)
        super().__init__(f"{source}: {count} error{'s' if count != 1 else ''}\n{lines}")
