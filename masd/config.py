"""masd configuration: the TOML file of PROFILE §10, loaded into frozen values.

``load_config`` reads the file and every secret it names, validates every key
and returns a :class:`Config`, or raises :class:`ConfigErrors` holding *all*
the errors found (never only the first).  Each error names its key path in
TOML syntax, e.g. ``domains."help.example".types.ticket.role``, and the value
refused.  Things that work but are probably not what the operator wants
(a secret file readable by others, a mode with no endpoint) are warnings in
``Config.warnings``.

Relative paths (token files, DKIM keys, the database, unix sockets) are
relative to the directory of the configuration file.  Secrets are kept out of
``repr`` so a logged config never shows them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeVar
from urllib.parse import unquote, urlsplit

from masd.core.errors import ConfigError, MasdError

__all__ = [
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
    "webhook_for",
]

DEFAULT_PATH: Final = Path("/etc/masd/masd.toml")


# --------------------------------------------------------------------------- values


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
class Endpoint:
    """The mode endpoint of a master type: where ``handoff.request`` goes."""

    domain: str
    type: str
    mode: str
    url: str
    token: str = field(repr=False)
    deadline: float
    fields: tuple[str, ...]


@dataclass(frozen=True)
class MasterPeer:
    """The outside master of a slave type."""

    domain: str
    type: str
    url: str
    token: str = field(repr=False)


@dataclass(frozen=True)
class Webhook:
    """A place a slave type's transfers policy may point at."""

    domain: str
    type: str
    url: str
    token: str = field(repr=False)
    fields: tuple[str, ...]


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
class ServerConfig:
    lmtp: Listen
    http: Listen
    policy: Listen | None
    milter: Listen | None
    public_url: str
    database: Path
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


# --------------------------------------------------------------------------- small parsers

_DURATION = re.compile(r"(?:([0-9]{1,9})d)?(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,9})s)?")
_UNITS: Final = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
DURATION_HINT: Final = "(30s, 15m, 2h, 3d)"


def parse_duration(text: str) -> float:
    """``"30s"``, ``"15m"``, ``"2h"``, ``"3d"`` (or a compound such as ``"1h30m"``) in seconds."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None or not any(match.groups()):
        raise ValueError(f"{_show(text)} is not a duration {DURATION_HINT}")
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
            raise ValueError(f"has a bad label {_show(label)} (letters, digits and inner hyphens)")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise ValueError(f"has a bad A-label {_show(label)}") from None
    return ascii_name


_LISTEN_HINT: Final = "is not a listener (unix:/path, host:port or [ipv6]:port)"
_UNIX_PATH_MAX: Final = 107  # sun_path is 108 bytes including the final NUL


def parse_listen(text: str, *, base_dir: Path | None = None, min_port: int = 0) -> Listen:
    """``unix:/run/masd/lmtp.sock``, ``127.0.0.1:2424``, ``[::1]:2424`` or ``name:port``.

    Port 0 (the system picks one) is allowed for listeners; pass ``min_port=1``
    for an address masd connects to.  ValueError carries the reason.
    """
    if text.startswith("unix:"):
        raw = text[len("unix:") :]
        if not raw or "\0" in raw:
            raise ValueError(_LISTEN_HINT)
        path = Path(raw)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if len(str(path).encode()) > _UNIX_PATH_MAX:
            raise ValueError(f"is longer than {_UNIX_PATH_MAX} bytes (the unix socket limit)")
        return UnixListen(path)
    bracketed = re.fullmatch(r"\[([^\]]*)\]:([0-9]{1,5})", text)
    if bracketed:
        host, port_text = bracketed.groups()
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError(_LISTEN_HINT)
        except ValueError:
            raise ValueError(f"{_LISTEN_HINT}: {_show(host)} is not an IPv6 address") from None
    else:
        plain = re.fullmatch(r"([^:\[\]]+):([0-9]{1,5})", text)
        if plain is None:
            if text.count(":") > 1:
                raise ValueError(f"{_LISTEN_HINT}: put an IPv6 address in brackets")
            raise ValueError(_LISTEN_HINT)
        host, port_text = plain.groups()
        if not _is_host(host):
            raise ValueError(f"{_LISTEN_HINT}: {_show(host)} is not a host name or address")
        host = host.lower()
    port = int(port_text)
    if not min_port <= port <= 65535:
        raise ValueError(f"has port {port}, not in {min_port}-65535")
    return TcpListen(host, port)


def _is_host(host: str) -> bool:
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


def _url_problem(url: str) -> str | None:
    """Why ``url`` is not an absolute http(s) URL masd may talk to, or None."""
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "is not an http or https URL (it contains whitespace or control characters)"
    parts = urlsplit(url)
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

    PROFILE §10: "A transfers webhook URL must have the same scheme, host and
    port as a configured ``webhooks.url`` and a path under its path (at a ``/``
    boundary); otherwise ``400 invalid-message``: a master cannot point masd at
    an arbitrary host."  Scheme and host compare case-insensitively, an absent
    port is the scheme's default, an empty path is ``/``.  A URL with
    credentials, a fragment, or a ``.``/``..`` path segment (also
    percent-encoded) matches nothing: such a path could leave the allowed tree
    once the server normalizes it.
    """
    wanted = _url_key(url)
    if wanted is None:
        return None
    for hook in type_config.webhooks:
        allowed = _url_key(hook.url)
        if allowed is None or allowed[:3] != wanted[:3]:
            continue
        base, path = allowed[3], wanted[3]
        if path == base or path.startswith(base if base.endswith("/") else base + "/"):
            return hook
    return None


def _url_key(url: str) -> tuple[str, str, int, str] | None:
    if _url_problem(url) is not None:
        return None
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
    path = parts.path or "/"
    if any(segment in (".", "..") for segment in unquote(path).split("/")):
        return None
    return scheme, (parts.hostname or "").lower(), port, path


# --------------------------------------------------------------------------- error paths


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _seg(key: str) -> str:
    """A key as it appears in a path: bare when TOML allows it, else double-quoted."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{_seg(key)}" if path else _seg(key)


def _show(value: object) -> str:
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


_TYPE_NAMES: Final[dict[type, str]] = {
    str: "a string",
    int: "an integer",
    bool: "a boolean (true or false)",
    list: "an array",
    dict: "a table",
}

# Grammar of PROFILE §1: type = ALPHA *31(ALPHA / DIGIT / "-"), mode = ALPHA *15(...),
# id = 1*64(ALPHA / DIGIT / "-" / "_" / "."), case-insensitive and stored lowercase.
_TYPE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
_MODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,15}")
_ID_CHARS = re.compile(r"[A-Za-z0-9_.-]*")
_FIELD_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID_DIGITS_ROOM: Final = 10  # ids are <id_prefix><n>; leave room for n up to 10 digits
_TYPE_ID_MAX: Final = 47  # PROFILE §1: "type=id" over 47 octets does not fit with a 16-char mode

T = TypeVar("T")
_REQUIRED: Final = object()


# --------------------------------------------------------------------------- the checker


@dataclass
class _Secret:
    path: str
    kind: str  # "admin", "mode", "master" or "webhook"
    url: str  # "" for the admin secret, which belongs to no peer


class _Checker:
    """Collects errors and warnings while the file is walked, in file order."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.errors: list[ConfigError] = []
        self.warnings: list[str] = []
        self.secrets: dict[str, _Secret] = {}

    def error(self, path: str, detail: str) -> None:
        self.errors.append(ConfigError(detail, path=path))

    def warn(self, path: str, text: str) -> None:
        self.warnings.append(f"{path}: {text}" if path else text)

    # ---- tables and typed keys

    def table(self, value: object, path: str, allowed: frozenset[str]) -> dict[str, Any]:
        """``value`` as a table whose unknown keys are errors; {} when it is not a table."""
        if not isinstance(value, dict):
            self.error(path, f"{_show(value)} is not a table")
            return {}
        for key in value:
            if key not in allowed:
                self.error(_join(path, key), "unknown key")
        return value

    def get(self, table: Mapping[str, Any], path: str, key: str, kind: type[T], default: T) -> T:
        """``table[key]`` when it is a ``kind``, else ``default`` (with an error if present)."""
        if key not in table:
            return default
        value = table[key]
        if not _has_type(value, kind):
            self.error(_join(path, key), f"{_show(value)} is not {_TYPE_NAMES[kind]}")
            return default
        return value  # type: ignore[no-any-return]

    def require(
        self, table: Mapping[str, Any], path: str, key: str, kind: type[T], fallback: T
    ) -> T:
        if key not in table:
            self.error(_join(path, key), f"missing: {_TYPE_NAMES[kind]} is required here")
            return fallback
        return self.get(table, path, key, kind, fallback)

    def strings(
        self, table: Mapping[str, Any], path: str, key: str, check: Callable[[str, str], str | None]
    ) -> tuple[str, ...]:
        """An array of strings, each passed through ``check(path, value) -> kept or None``."""
        items = self.get(table, path, key, list, [])
        kept: list[str] = []
        for index, item in enumerate(items):
            item_path = f"{_join(path, key)}[{index}]"
            if not isinstance(item, str):
                self.error(item_path, f"{_show(item)} is not a string")
                continue
            value = check(item_path, item)
            if value is None:
                continue
            if value in kept:
                self.error(item_path, f"{_show(item)} is listed twice")
                continue
            kept.append(value)
        return tuple(kept)

    # ---- values

    def duration(self, path: str, text: str) -> float:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            self.error(path, str(exc))
            return 1.0
        if seconds <= 0:
            self.error(path, f"{_show(text)} is not longer than zero")
        return seconds

    def require_url(self, table: Mapping[str, Any], path: str, key: str) -> str:
        """A required http(s) URL; "" (with an error) when missing, mistyped or bad."""
        url = self.require(table, path, key, str, "")
        if isinstance(table.get(key), str):
            return self.url(_join(path, key), url)
        return url

    def url(self, path: str, text: str) -> str:
        problem = _url_problem(text)
        if problem is not None:
            self.error(path, f"{_show(text)} {problem}")
        return text

    def listen(self, path: str, text: str, *, min_port: int = 0) -> Listen | None:
        try:
            return parse_listen(text, base_dir=self.base_dir, min_port=min_port)
        except ValueError as exc:
            self.error(path, f"{_show(text)} {exc}")
            return None

    def resolve(self, text: str) -> Path:
        path = Path(text).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def read_file(self, path: str, text: str) -> bytes | None:
        """The bytes of a secret file; errors for missing or non-regular files.

        A file readable by group or others (``mode & 0o077``) is a warning.
        """
        if not text:
            self.error(path, '"" is not a file name')
            return None
        file = self.resolve(text)
        try:
            info = file.stat()
            if not stat.S_ISREG(info.st_mode):
                self.error(path, f"{_show(str(file))} is not a regular file")
                return None
            data = file.read_bytes()
        except OSError as exc:
            self.error(path, f"cannot read {_show(str(file))}: {exc.strerror or exc}")
            return None
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            self.warn(
                path,
                f"{file} is readable by group or others (mode {mode:04o}); chmod 600 it",
            )
        return data

    def secret(self, path: str, text: str, *, kind: str, url: str = "") -> str:
        """Read a token file; register the secret as the identity of a ``kind`` peer at ``url``."""
        data = self.read_file(path, text)
        if data is None:
            return ""
        try:
            token = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.error(path, f"{_show(str(self.resolve(text)))} is not UTF-8 text")
            return ""
        if not token:
            self.error(path, f"{_show(str(self.resolve(text)))} is empty")
            return ""
        if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
            self.error(
                path,
                f"{_show(str(self.resolve(text)))} must hold one secret of printable ASCII "
                "without spaces (it is sent in an Authorization header)",
            )
            return ""
        # PROFILE §6: "The sender's identity is the peer whose secret matched,
        # never a field of the message."  One secret must therefore name one
        # peer: two peers of different kinds or at different URLs (or a peer
        # and the admin) sharing a secret could act as each other.  The same
        # service (same kind, same URL) may serve several types with one secret.
        first = self.secrets.get(token)
        if first is None:
            self.secrets[token] = _Secret(path, kind, url)
        elif (first.kind, first.url) != (kind, url) or kind == "admin":
            whose = (
                "the admin secret" if first.kind == "admin" else f"the {first.kind} at {first.url}"
            )
            self.error(
                path,
                f"holds the same secret as {first.path} ({whose}); each peer needs its own "
                "secret, because the secret is its identity",
            )
        return token


def _has_type(value: object, kind: type) -> bool:
    if kind is int and isinstance(value, bool):  # TOML true is not an integer
        return False
    return isinstance(value, kind)


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path) -> Config:
    """Read, parse and validate the file at ``path`` and the secrets it names."""
    file = Path(path)
    source = str(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigErrors(
            [ConfigError(f"{source}: cannot read: {exc.strerror or exc}")], source=source
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigErrors(
            [ConfigError(f"{source}:{line}: invalid TOML: the file is not UTF-8")],
            source=source,
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors([_syntax_error(source, text, exc)], source=source) from None
    base_dir = Path(os.path.abspath(file)).parent  # lexical: a symlinked file keeps its directory
    return parse_config(data, base_dir=base_dir, source=source)


def _syntax_error(source: str, text: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    """One error naming the file, line and column of a TOML syntax error."""
    message = str(exc)
    where = re.search(r" \(at line (\d+), column (\d+)\)$", message)
    if where:
        line, column = int(where.group(1)), int(where.group(2))
        message = message[: where.start()]
    else:  # "(at end of document)"
        message = re.sub(r" \(at end of document\)$", "", message)
        lines = text.split("\n")
        line, column = len(lines), len(lines[-1]) + 1
    return ConfigError(f"{source}:{line}:{column}: invalid TOML: {message}")


_TOP_KEYS: Final = frozenset({"server", "domains"})
_SERVER_KEYS: Final = frozenset(
    {
        "lmtp",
        "http",
        "policy",
        "milter",
        "public_url",
        "database",
        "smtp_relay",
        "trusted_authserv_ids",
        "trusted_hosts",
        "admin_token_file",
        "recipient_delimiter",
        "max_message_bytes",
        "retry_for",
        "hostname",
        "max_lmtp_sessions",
        "max_http_connections",
    }
)
_DOMAIN_KEYS: Final = frozenset({"dkim", "types"})
_DKIM_KEYS: Final = frozenset({"selector", "key_file"})
_COMMON_TYPE_KEYS: Final = frozenset({"role", "require_dmarc_for_handoff", "send_cap"})
# Keys that belong to one role only, with the reason they are wrong in the other.
_MASTER_ONLY: Final = {
    "modes": "modes do not apply to slave types, PROFILE §9",
    "endpoints": "a slave type hands off to the webhook its case policy names",
    "acknowledge": "in the slave role email mails only on mail.send or under autonomous_send",
    "id_prefix": "in the slave role case ids come from the master's case.assign",
}
_SLAVE_ONLY: Final = {
    "master": "in the master role email owns the case",
    "policy": "case policy comes from an outside master, in the slave role",
    "webhooks": "a master type hands off to its endpoints",
}
_TYPE_KEYS: Final = _COMMON_TYPE_KEYS | frozenset(_MASTER_ONLY) | frozenset(_SLAVE_ONLY)
_SEND_CAP_KEYS: Final = frozenset({"per_case", "per_recipient_per_day"})
_ENDPOINT_KEYS: Final = frozenset({"url", "token_file", "deadline", "fields"})
_MASTER_KEYS: Final = frozenset({"url", "token_file"})
_POLICY_KEYS: Final = frozenset({"autonomous_send", "transfers"})
_WEBHOOK_KEYS: Final = frozenset({"url", "token_file", "fields"})


def parse_config(data: Mapping[str, Any], *, base_dir: Path, source: str = "<config>") -> Config:
    """Validate parsed TOML ``data``; relative paths are relative to ``base_dir``.

    Token and key files are read here.  Raises :class:`ConfigErrors` with every
    error found.
    """
    check = _Checker(base_dir)
    top = check.table(dict(data), "", _TOP_KEYS)
    server = _parse_server(check, check.get(top, "", "server", dict, {}))
    domains: dict[str, DomainConfig] = {}
    written: dict[str, str] = {}  # A-label name -> the key as written
    if "domains" not in top:
        check.error("domains", "missing: at least one domain is required")
    for key, raw in check.get(top, "", "domains", dict, {}).items():
        path = _join("domains", key)
        try:
            name = normalize_domain(key)
        except ValueError as exc:
            check.error(path, f"{_show(key)} {exc}")
            continue
        if name in written:
            check.error(path, f"{_show(key)} is the same domain as {_show(written[name])}")
            continue
        written[name] = key
        domains[name] = _parse_domain(check, name, raw, path)
    if top.get("domains") == {}:
        check.error("domains", "empty: at least one domain is required")
    if check.errors:
        raise ConfigErrors(check.errors, source=source)
    return Config(
        server=server,
        domains=MappingProxyType(domains),
        source=source,
        warnings=tuple(check.warnings),
    )


def _parse_server(check: _Checker, raw: dict[str, Any]) -> ServerConfig:
    path = "server"
    table = check.table(raw, path, _SERVER_KEYS)

    def listen(key: str, default: str | None) -> Listen | None:
        text = check.get(table, path, key, str, default)
        return None if text is None else check.listen(_join(path, key), text)

    lmtp = listen("lmtp", "unix:/run/masd/lmtp.sock") or UnixListen(Path("/run/masd/lmtp.sock"))
    http = listen("http", "127.0.0.1:8025") or TcpListen("127.0.0.1", 8025)
    policy = listen("policy", None)
    milter = listen("milter", None)
    listeners = [("lmtp", lmtp), ("http", http), ("policy", policy), ("milter", milter)]
    for index, (key, where) in enumerate(listeners):
        for other, there in listeners[:index]:
            if where is not None and where == there:
                named, same = (key, other) if key in table else (other, key)
                check.error(_join(path, named), f"{_show(str(where))} is also server.{same}")

    if "public_url" in table:
        public_url = check.url(
            _join(path, "public_url"), check.get(table, path, "public_url", str, "http://x")
        )
        if urlsplit(public_url).query:
            check.error(_join(path, "public_url"), f"{_show(public_url)} must not have a query")
    elif isinstance(http, TcpListen):
        public_url = f"http://{http}"
        if http.host in ("0.0.0.0", "::"):  # noqa: S104  (a check, not a bind)
            check.warn(
                _join(path, "public_url"),
                f"defaults to {public_url}, which peers cannot reach; set it",
            )
    else:
        check.error(
            _join(path, "public_url"), "missing: required when server.http is a unix socket"
        )
        public_url = "http://localhost"
    public_url = public_url.rstrip("/")

    database_text = check.get(table, path, "database", str, "/var/lib/masd/masd.db")
    if not database_text:
        check.error(_join(path, "database"), '"" is not a file name')
    database = check.resolve(database_text or ".")

    relay_text = check.get(table, path, "smtp_relay", str, "127.0.0.1:25")
    relay = check.listen(_join(path, "smtp_relay"), relay_text, min_port=1)
    if isinstance(relay, UnixListen):
        check.error(_join(path, "smtp_relay"), f"{_show(relay_text)} is not host:port")
    smtp_relay = relay if isinstance(relay, TcpListen) else TcpListen("127.0.0.1", 25)

    def authserv_id(item_path: str, text: str) -> str | None:
        if not text or not all(0x21 <= ord(ch) <= 0x7E and ch not in ';()"' for ch in text):
            check.error(item_path, f"{_show(text)} is not an authserv-id")
            return None
        return text.lower()

    ids = check.strings(table, path, "trusted_authserv_ids", authserv_id)
    if not ids:
        check.warn(
            _join(path, "trusted_authserv_ids"),
            "empty: no Authentication-Results is trusted, so no mail can be authenticated "
            "and no handoff or reply will be sent (PROFILE §3)",
        )

    def host(item_path: str, text: str) -> str | None:
        if not _is_host(text) and not _is_ipv6(text):
            check.error(item_path, f"{_show(text)} is not a host name")
            return None
        return text.lower()

    hosts = check.strings(table, path, "trusted_hosts", host) if "trusted_hosts" in table else ids

    admin_token = None
    if "admin_token_file" in table:
        admin_file = check.get(table, path, "admin_token_file", str, None)
        if admin_file is not None:
            admin_token = check.secret(_join(path, "admin_token_file"), admin_file, kind="admin")

    delimiter = check.get(table, path, "recipient_delimiter", str, "+")
    if len(delimiter) > 1:
        check.error(
            _join(path, "recipient_delimiter"),
            f'{_show(delimiter)} is not one character or ""',
        )
    elif delimiter and not 0x21 <= ord(delimiter) <= 0x7E:
        check.error(
            _join(path, "recipient_delimiter"),
            f"{_show(delimiter)} is not a printable ASCII character",
        )
    elif delimiter and (delimiter.isalnum() or delimiter in '-_.=!@"'):
        # A delimiter must not be a character a MAS local part can hold (PROFILE §1:
        # letters, digits, "-", "_", "." in type and id; "=" and "!" separate them).
        check.error(
            _join(path, "recipient_delimiter"),
            f"{_show(delimiter)} cannot be the delimiter: it can appear in a MAS local part",
        )

    max_bytes = check.get(table, path, "max_message_bytes", int, 26214400)
    if max_bytes <= 0:
        check.error(_join(path, "max_message_bytes"), f"{max_bytes} is not a positive integer")
    limits = {}
    for key, default in (("max_lmtp_sessions", 100), ("max_http_connections", 1000)):
        limits[key] = check.get(table, path, key, int, default)
        if limits[key] <= 0:
            check.error(_join(path, key), f"{limits[key]} is not a positive integer")

    retry_text = check.get(table, path, "retry_for", str, "3d")
    retry_for = check.duration(_join(path, "retry_for"), retry_text)

    hostname = check.get(table, path, "hostname", str, "localhost")
    try:
        if not hostname.isascii():
            raise ValueError(hostname)
        hostname = normalize_domain(hostname)
    except ValueError:
        check.error(_join(path, "hostname"), f"{_show(hostname)} is not an ASCII host name")

    return ServerConfig(
        lmtp=lmtp,
        http=http,
        policy=policy,
        milter=milter,
        public_url=public_url,
        database=database,
        smtp_relay=smtp_relay,
        trusted_authserv_ids=ids,
        trusted_hosts=hosts,
        admin_token=admin_token,
        recipient_delimiter=delimiter,
        max_message_bytes=max_bytes,
        retry_for=retry_for,
        hostname=hostname,
        max_lmtp_sessions=limits["max_lmtp_sessions"],
        max_http_connections=limits["max_http_connections"],
    )


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _parse_domain(check: _Checker, name: str, raw: object, path: str) -> DomainConfig:
    table = check.table(raw, path, _DOMAIN_KEYS)
    dkim: tuple[Dkim, ...] = ()
    if "dkim" in table:
        dkim = _parse_dkim_keys(check, table["dkim"], _join(path, "dkim"))
    types: dict[str, TypeConfig] = {}
    types_path = _join(path, "types")
    if "types" not in table:
        check.error(types_path, "missing: a domain needs at least one type")
    for key, type_raw in check.get(table, path, "types", dict, {}).items():
        type_path = _join(types_path, key)
        if not _TYPE_NAME.fullmatch(key):
            check.error(
                type_path,
                f"{_show(key)} is not a type name (a letter, then up to 31 letters, "
                "digits or hyphens; PROFILE §1)",
            )
            continue
        type_name = key.lower()
        if type_name in types:
            check.error(type_path, f"{_show(key)} is the type {type_name} again")
            continue
        types[type_name] = _parse_type(check, name, type_name, type_raw, type_path)
    if table.get("types") == {}:
        check.error(types_path, "empty: a domain needs at least one type")
    return DomainConfig(name=name, dkim_keys=dkim, types=MappingProxyType(types))


_PEM_KEY = re.compile(
    rb"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----\s+[A-Za-z0-9+/=\s:,-]+?"
    rb"-----END \1PRIVATE KEY-----"
)


def _parse_dkim_keys(check: _Checker, raw: object, path: str) -> tuple[Dkim, ...]:
    """One key (a table) or several signing together (an array of tables, e.g. RSA + Ed25519)."""
    if not isinstance(raw, list):
        one = _parse_dkim(check, raw, path)
        return () if one is None else (one,)
    if not raw:
        check.error(path, "empty: give one key table, or leave dkim out")
    keys = [_parse_dkim(check, item, f"{path}[{i}]") for i, item in enumerate(raw)]
    found = tuple(key for key in keys if key is not None)
    selectors = [key.selector for key in found]
    for i, selector in enumerate(selectors):
        if selector in selectors[:i]:
            check.error(f"{path}[{i}].selector", f"{_show(selector)} is used twice")
    return found


def _parse_dkim(check: _Checker, raw: object, path: str) -> Dkim | None:
    table = check.table(raw, path, _DKIM_KEYS)
    if not isinstance(raw, dict):
        return None
    selector = check.require(table, path, "selector", str, "")
    if "selector" in table and isinstance(table["selector"], str):
        labels = selector.split(".")
        if not all(
            re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels
        ):
            check.error(_join(path, "selector"), f"{_show(selector)} is not a DNS label")
    key_text = check.require(table, path, "key_file", str, "")
    key = b""
    if "key_file" in table and isinstance(table["key_file"], str):
        data = check.read_file(_join(path, "key_file"), key_text)
        if data is not None:
            if _PEM_KEY.search(data) is None:
                check.error(
                    _join(path, "key_file"),
                    f"{_show(str(check.resolve(key_text)))} is not a PEM private key",
                )
            key = data
    return Dkim(selector=selector, key_file=check.resolve(key_text or "."), key=key)


def _parse_type(check: _Checker, domain: str, name: str, raw: object, path: str) -> TypeConfig:
    table = check.table(raw, path, _TYPE_KEYS)
    role = check.require(table, path, "role", str, "")
    if "role" in table and role not in ("master", "slave"):
        check.error(_join(path, "role"), f'{_show(table["role"])} is not "master" or "slave"')
    wrong_here = _SLAVE_ONLY if role == "master" else _MASTER_ONLY if role == "slave" else {}
    for key, why in wrong_here.items():
        if key in table:
            check.error(_join(path, key), f"not allowed in a {role} type ({why})")

    # PROFILE §3: "type option require_dmarc_for_handoff, default true".
    dmarc = check.get(table, path, "require_dmarc_for_handoff", bool, True)
    send_cap = _parse_send_cap(check, table, path)

    modes: tuple[str, ...] = ()
    endpoints: dict[str, Endpoint] = {}
    id_prefix = f"{name}-"
    acknowledge = True
    master = None
    policy = Policy()
    webhooks: tuple[Webhook, ...] = ()

    if role == "master":
        modes = check.strings(table, path, "modes", _mode_checker(check))
        id_prefix = _parse_id_prefix(check, table, path, name)
        acknowledge = check.get(table, path, "acknowledge", bool, True)
        endpoints_path = _join(path, "endpoints")
        for key, endpoint_raw in check.get(table, path, "endpoints", dict, {}).items():
            endpoint_path = _join(endpoints_path, key)
            mode = _mode_checker(check)(endpoint_path, key)
            if mode is None:
                continue
            if mode in endpoints:
                check.error(endpoint_path, f"{_show(key)} is the endpoint for {mode} again")
                continue
            if mode not in modes:
                # An endpoint for a mode the statute does not enable could never
                # be used: PROFILE §3 refuses such a request with mode-not-enabled.
                check.error(
                    endpoint_path,
                    f"{_show(key)} is not in modes, so this endpoint could never be used "
                    "(a handoff to it is refused with mode-not-enabled, PROFILE §3)",
                )
                continue
            endpoints[mode] = _parse_endpoint(
                check, domain, name, mode, endpoint_raw, endpoint_path
            )
        for mode in modes:
            if mode not in endpoints:
                check.warn(
                    _join(path, "modes"),
                    f"{_show(mode)} has no endpoint: a handoff to it is refused with "
                    "mode-unavailable (PROFILE §3)",
                )
    elif role == "slave":
        master = _parse_master(check, table, path, domain, name)
        webhooks = _parse_webhooks(check, table, path, domain, name)
        policy = _parse_policy(check, table, path, webhooks)

    return TypeConfig(
        name=name,
        role=role,
        modes=modes,
        id_prefix=id_prefix,
        acknowledge=acknowledge,
        require_dmarc_for_handoff=dmarc,
        send_cap=send_cap,
        endpoints=MappingProxyType(endpoints),
        master=master,
        policy=policy,
        webhooks=webhooks,
    )


def _mode_checker(check: _Checker) -> Callable[[str, str], str | None]:
    def mode(path: str, text: str) -> str | None:
        if not _MODE_NAME.fullmatch(text):
            check.error(
                path,
                f"{_show(text)} is not a mode name (a letter, then up to 15 letters, "
                "digits or hyphens; PROFILE §1)",
            )
            return None
        return text.lower()

    return mode


def _field_checker(check: _Checker) -> Callable[[str, str], str | None]:
    def field_name(path: str, text: str) -> str | None:
        if not _FIELD_NAME.fullmatch(text):
            check.error(
                path, f"{_show(text)} is not a field name (letters, digits, - and _; up to 64)"
            )
            return None
        if text.lower() == "subject":
            # PROFILE §5: details hold "subject and each field of the endpoint's fields".
            check.error(path, '"subject" is always in the details; it is not a field')
            return None
        return text.lower()

    return field_name


def _parse_id_prefix(check: _Checker, table: Mapping[str, Any], path: str, name: str) -> str:
    # PROFILE §1: "email assigns ids <id_prefix><n> (id_prefix default <type>-)".
    default = f"{name}-"
    prefix = check.get(table, path, "id_prefix", str, default)
    if prefix == default:
        return prefix
    where = _join(path, "id_prefix")
    # id = 1*64(ALPHA / DIGIT / "-" / "_" / "."), no leading or doubled ".".
    if not _ID_CHARS.fullmatch(prefix) or prefix.startswith(".") or ".." in prefix:
        check.error(
            where,
            f"{_show(prefix)} is not made of id characters (letters, digits, -, _ and "
            "inner single dots; PROFILE §1)",
        )
    elif len(name) + 1 + len(prefix) + _ID_DIGITS_ROOM > _TYPE_ID_MAX:
        # Keep "type=id" within the 47 octets that leave room for "!mode" of
        # the longest mode name inside the 64-octet local part.
        check.error(
            where,
            f"{_show(prefix)} is too long: {name}={prefix} and a {_ID_DIGITS_ROOM}-digit "
            f"number must fit in {_TYPE_ID_MAX} octets (PROFILE §1)",
        )
    return prefix


def _parse_send_cap(check: _Checker, table: Mapping[str, Any], path: str) -> SendCap:
    if "send_cap" not in table:
        return SendCap()
    cap_path = _join(path, "send_cap")
    cap = check.table(table["send_cap"], cap_path, _SEND_CAP_KEYS)
    values = []
    for key, default in (("per_case", 20), ("per_recipient_per_day", 10)):
        value = check.get(cap, cap_path, key, int, default)
        if value <= 0:
            check.error(_join(cap_path, key), f"{value} is not a positive integer")
        values.append(value)
    return SendCap(per_case=values[0], per_recipient_per_day=values[1])


def _parse_endpoint(
    check: _Checker, domain: str, type_name: str, mode: str, raw: object, path: str
) -> Endpoint:
    table = check.table(raw, path, _ENDPOINT_KEYS)
    url, token, deadline = "", "", 1.0
    if isinstance(raw, dict):
        url = check.require_url(table, path, "url")
        token_file = check.require(table, path, "token_file", str, "")
        if isinstance(table.get("token_file"), str):
            token = check.secret(_join(path, "token_file"), token_file, kind="mode", url=url)
        deadline_text = check.require(table, path, "deadline", str, "")
        if isinstance(table.get("deadline"), str):
            deadline = check.duration(_join(path, "deadline"), deadline_text)
    fields = check.strings(table, path, "fields", _field_checker(check))
    return Endpoint(
        domain=domain,
        type=type_name,
        mode=mode,
        url=url,
        token=token,
        deadline=deadline,
        fields=fields,
    )


def _parse_master(
    check: _Checker, table: Mapping[str, Any], path: str, domain: str, type_name: str
) -> MasterPeer | None:
    master_path = _join(path, "master")
    if "master" not in table:
        check.error(master_path, "missing: a slave type needs its master ({url, token_file})")
        return None
    raw = table["master"]
    peer = check.table(raw, master_path, _MASTER_KEYS)
    if not isinstance(raw, dict):
        return None
    url = check.require_url(peer, master_path, "url")
    token_file = check.require(peer, master_path, "token_file", str, "")
    token = ""
    if isinstance(peer.get("token_file"), str):
        token = check.secret(_join(master_path, "token_file"), token_file, kind="master", url=url)
    return MasterPeer(domain=domain, type=type_name, url=url, token=token)


def _parse_webhooks(
    check: _Checker, table: Mapping[str, Any], path: str, domain: str, type_name: str
) -> tuple[Webhook, ...]:
    hooks: list[Webhook] = []
    for index, raw in enumerate(check.get(table, path, "webhooks", list, [])):
        hook_path = f"{_join(path, 'webhooks')}[{index}]"
        hook = check.table(raw, hook_path, _WEBHOOK_KEYS)
        if not isinstance(raw, dict):
            continue
        url = check.require_url(hook, hook_path, "url")
        token_file = check.require(hook, hook_path, "token_file", str, "")
        token = ""
        if isinstance(hook.get("token_file"), str):
            token = check.secret(
                _join(hook_path, "token_file"), token_file, kind="webhook", url=url
            )
        fields = check.strings(hook, hook_path, "fields", _field_checker(check))
        hooks.append(Webhook(domain=domain, type=type_name, url=url, token=token, fields=fields))
    return tuple(hooks)


def _parse_policy(
    check: _Checker, table: Mapping[str, Any], path: str, webhooks: tuple[Webhook, ...]
) -> Policy:
    # PROFILE §9: "A case starts with the type's policy defaults, overridden by
    # case.assign.policy"; the defaults are {autonomous_send=false, transfers="block"}.
    if "policy" not in table:
        return Policy()
    policy_path = _join(path, "policy")
    policy = check.table(table["policy"], policy_path, _POLICY_KEYS)
    autonomous = check.get(policy, policy_path, "autonomous_send", bool, False)
    transfers = "block"
    where = _join(policy_path, "transfers")
    raw = policy.get("transfers", "block")
    if isinstance(raw, dict):
        target = check.table(raw, where, frozenset({"webhook"}))
        url = check.require(target, where, "webhook", str, "")
        if isinstance(target.get("webhook"), str):
            url_path = _join(where, "webhook")
            if _url_problem(url) is not None:
                check.url(url_path, url)
            elif webhook_for(_hooks_only(webhooks), url) is None:
                check.error(
                    url_path,
                    f"{_show(url)} is not under any webhooks url (same scheme, host and "
                    "port, and a path under its path; PROFILE §10)",
                )
            transfers = url
    elif raw != "block":
        check.error(where, f'{_show(raw)} is not "block" or {{webhook = URL}}')
    return Policy(autonomous_send=autonomous, transfers=transfers)


def _hooks_only(webhooks: tuple[Webhook, ...]) -> TypeConfig:
    """A stand-in type holding only ``webhooks``, to reuse :func:`webhook_for`."""
    return TypeConfig(
        name="",
        role="slave",
        modes=(),
        id_prefix="",
        acknowledge=False,
        require_dmarc_for_handoff=True,
        send_cap=SendCap(),
        endpoints=MappingProxyType({}),
        master=None,
        policy=Policy(),
        webhooks=webhooks,
    )


# --------------------------------------------------------------------------- summary


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def format_summary(config: Config) -> str:
    """A one-screen summary of what ``config`` makes masd do (for ``check-config``)."""
    server = config.server
    lines = [
        f"{config.source}: OK",
        f"lmtp      {server.lmtp}",
        f"http      {server.http}  (public URL {server.public_url})",
        f"policy    {server.policy if server.policy is not None else 'off'}",
        f"milter    {server.milter if server.milter is not None else 'off'}",
        f"database  {server.database}",
        f"relay     {server.smtp_relay}  hostname {server.hostname}",
        "trusted   authserv-ids "
        + (", ".join(server.trusted_authserv_ids) or "none")
        + "; hosts "
        + (", ".join(server.trusted_hosts) or "none"),
        f"admin API {'on' if server.admin_token else 'off (no admin_token_file)'}"
        f"; retry for {format_duration(server.retry_for)}"
        f"; max message {server.max_message_bytes} bytes"
        f"; delimiter {json.dumps(server.recipient_delimiter)}",
    ]
    for domain in config.domains.values():
        selectors = ", ".join(key.selector for key in domain.dkim_keys)
        dkim = f"DKIM selector {selectors}" if selectors else "no DKIM"
        lines.append(f"domain {domain.name} ({dkim})")
        for tc in domain.types.values():
            cap = f"send cap {tc.send_cap.per_case}/case {tc.send_cap.per_recipient_per_day}/day"
            dmarc = f"dmarc for handoff {_yes(tc.require_dmarc_for_handoff)}"
            if tc.role == "master":
                lines.append(
                    f"  {tc.name}: master, ids {tc.id_prefix}<n>, acknowledge "
                    f"{_yes(tc.acknowledge)}, {dmarc}, {cap}"
                )
                if not tc.modes:
                    lines.append("    no modes enabled")
                for mode in tc.modes:
                    endpoint = tc.endpoints.get(mode)
                    if endpoint is None:
                        lines.append(f"    !{mode}: no endpoint (mode-unavailable)")
                        continue
                    fields = ", ".join(endpoint.fields) or "none"
                    lines.append(
                        f"    !{mode} -> {endpoint.url}  deadline "
                        f"{format_duration(endpoint.deadline)}, fields {fields}"
                    )
            else:
                master_url = tc.master.url if tc.master else "?"
                lines.append(f"  {tc.name}: slave, master {master_url}, {dmarc}, {cap}")
                lines.append(
                    f"    policy: autonomous_send {_yes(tc.policy.autonomous_send)}, "
                    f"transfers {tc.policy.transfers}"
                )
                for hook in tc.webhooks:
                    fields = ", ".join(hook.fields) or "none"
                    lines.append(f"    webhook {hook.url}  fields {fields}")
    return "\n".join(lines)
