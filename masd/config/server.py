"""``[server]``: listeners, the store, the relay, trust, limits."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from masd.config.checker import Checker
from masd.config.model import (
    Database,
    Listen,
    PostgresDatabase,
    ServerConfig,
    TcpListen,
    UnixListen,
)
from masd.config.names import ascii_host_name, is_host, is_ipv6, join, show
from masd.config.placeholders import MAKE_ONE

PATH: Final = "server"
_SERVER_KEYS: Final = frozenset(
    {
        "lmtp",
        "http",
        "policy",
        "milter",
        "mcp",
        "public_url",
        "database",
        "database_password_file",
        "claim_timeout",
        "smtp_relay",
        "trusted_authserv_ids",
        "trusted_hosts",
        "admin_token_file",
        "recipient_delimiter",
        "max_message_bytes",
        "retry_for",
        "peer_timeout",
        "suppress_for",
        "hostname",
        "max_lmtp_sessions",
        "max_http_connections",
        "max_followers",
        "domains_dir",
        "max_policy_connections",
        "max_milter_connections",
        "log_format",
        "console",
        "pid_file",
    }
)
#: The fewest characters of the admin secret while the console (which signs in with it
#: from a browser form) is on.
CONSOLE_SECRET_MIN: Final = 32
#: Where domain files are looked for when ``server.domains_dir`` is not set:
#: next to the main file (``/etc/masd/domains.d`` for ``/etc/masd/masd.toml``).
DEFAULT_DOMAINS_DIR: Final = "domains.d"
#: Why an authserv-id must look like a host name (shown with the refusal).
AUTHSERV_ID_RULE: Final = (
    "give the host name your authenticator writes first in Authentication-Results "
    "(letters, digits and hyphens in dot-separated labels, as RFC 8601 recommends)"
)


def parse_server(check: Checker, raw: dict[str, Any]) -> ServerConfig:
    table = check.table(raw, PATH, _SERVER_KEYS)
    lmtp, http, policy, milter, mcp = _listeners(check, table)
    public_url = _public_url(check, table, http)
    database = _database(check, table)
    smtp_relay = _relay(check, table)
    ids, hosts = _trust(check, table)
    admin_token = None
    if "admin_token_file" in table:
        admin_file = check.get(table, PATH, "admin_token_file", str, None)
        if admin_file is not None:
            admin_token = check.secret(join(PATH, "admin_token_file"), admin_file, kind="admin")
    delimiter = _delimiter(check, table)
    limits = _limits(check, table)
    durations = _durations(check, table)
    domains_dir = check.get(table, PATH, "domains_dir", str, DEFAULT_DOMAINS_DIR)
    if not domains_dir:
        check.error(join(PATH, "domains_dir"), '"" is not a directory name')
    console = _console(check, table, admin_token)
    hostname = check.get(table, PATH, "hostname", str, "localhost")
    try:
        hostname = ascii_host_name(hostname)
    except ValueError:
        check.error(join(PATH, "hostname"), f"{show(hostname)} is not an ASCII host name")
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
        max_message_bytes=limits["max_message_bytes"],
        retry_for=durations["retry_for"],
        peer_timeout=durations["peer_timeout"],
        hostname=hostname,
        max_lmtp_sessions=limits["max_lmtp_sessions"],
        max_http_connections=limits["max_http_connections"],
        max_followers=limits["max_followers"],
        domains_dir=check.resolve(domains_dir or DEFAULT_DOMAINS_DIR),
        domains_dir_set="domains_dir" in table,
        claim_timeout=durations["claim_timeout"],
        max_policy_connections=limits["max_policy_connections"],
        max_milter_connections=limits["max_milter_connections"],
        log_format=_log_format(check, table),
        console=console,
        suppress_for=durations["suppress_for"],
        pid_file=_pid_file(check, table),
        mcp=mcp,
    )


def _pid_file(check: Checker, table: Mapping[str, Any]) -> Path | None:
    """``server.pid_file``: relative to the configuration's directory, like every path."""
    text = check.get(table, PATH, "pid_file", str, "")
    if "pid_file" in table and not text:
        check.error(join(PATH, "pid_file"), '"" is not a file name')
    return check.resolve(text) if text else None


def _console(check: Checker, table: Mapping[str, Any], admin_token: str | None) -> bool:
    """``server.console``: it signs in with the admin secret, which must be long enough
    not to be guessed through a browser form."""
    console = check.get(table, PATH, "console", bool, False)
    if console and "admin_token_file" not in table:
        check.error(
            join(PATH, "console"),
            "needs server.admin_token_file: the console signs in with the admin secret",
        )
    elif console and admin_token and len(admin_token) < CONSOLE_SECRET_MIN:
        check.error(
            join(PATH, "admin_token_file"),
            f"the admin secret is {len(admin_token)} characters; with server.console on it "
            f"must be at least {CONSOLE_SECRET_MIN}, since a browser signs in with it "
            f"({MAKE_ONE})",
        )
    return console


#: The server's durations and their defaults.
_DURATIONS: Final = {
    "retry_for": "3d",
    "claim_timeout": "30s",
    "peer_timeout": "10s",
    "suppress_for": "30d",
}


def _durations(check: Checker, table: dict[str, Any]) -> dict[str, float]:
    """Each of :data:`_DURATIONS` in seconds, as given or its default."""
    return {
        key: check.duration(join(PATH, key), check.get(table, PATH, key, str, default))
        for key, default in _DURATIONS.items()
    }


#: The schemes libpq takes for a URI; any other "scheme://" is not a store masd can open.
POSTGRES_SCHEMES: Final = ("postgresql", "postgres")
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _database(check: Checker, table: Mapping[str, Any]) -> Database:
    """``database`` (a path or a ``postgresql://`` URI) and ``database_password_file``."""
    where = join(PATH, "database")
    text = check.get(table, PATH, "database", str, "/var/lib/masd/masd.db")
    password_file = check.get(table, PATH, "database_password_file", str, None)
    if _SCHEME.match(text) is None:
        if not text:
            check.error(where, '"" is not a file name')
        if password_file is not None:
            check.error(
                join(PATH, "database_password_file"),
                "only for a postgresql:// server.database (an SQLite file has no password)",
            )
        return check.resolve(text or ".")
    problem = uri_problem(text)
    if problem is not None:
        check.error(where, problem)
    password = None
    if password_file is not None:
        where_file = join(PATH, "database_password_file")
        data = check.read_file(where_file, password_file, private=True)
        password = None if data is None else _password(check, where_file, data)
    return PostgresDatabase(text, password)


def uri_problem(text: str, *, hint: str = "server.database_password_file") -> str | None:
    """Why ``text`` is not a store URI masd takes (never repeating a password), or None."""
    scheme = text.split("://", 1)[0]
    if scheme.lower() not in POSTGRES_SCHEMES:
        return (
            f"{show(scheme + '://...')} is not a store: give an SQLite file path or a "
            "postgresql:// URI"
        )
    try:
        parts = urlsplit(text)
        has_password = parts.password is not None
    except ValueError:
        return "is not a postgresql:// URI"
    if has_password or "password" in parse_qs(parts.query):
        return (
            f"holds a password, which is refused in the URI: put it in {hint} (mode 0600), "
            "or use libpq's .pgpass"
        )
    return None


def read_password(data: bytes) -> str:
    """The password a password file holds: its text, less one final newline.

    ``ValueError`` names what is wrong (not UTF-8, empty)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ValueError("is empty")
    if "\n" in text or "\x00" in text:
        raise ValueError("holds more than one line: the password is its one line")
    return text


def _password(check: Checker, where: str, data: bytes) -> str | None:
    try:
        return read_password(data)
    except ValueError as exc:
        check.error(where, f"the password file {exc}")
        return None


def _listeners(
    check: Checker, table: Mapping[str, Any]
) -> tuple[Listen, Listen, Listen | None, Listen | None, Listen | None]:
    """lmtp, http, policy, milter and mcp; no two on one address."""

    def listen(key: str, default: str | None) -> Listen | None:
        text = check.get(table, PATH, key, str, default)
        return None if text is None else check.listen(join(PATH, key), text)

    lmtp = listen("lmtp", "unix:/run/masd/lmtp.sock") or UnixListen(Path("/run/masd/lmtp.sock"))
    http = listen("http", "127.0.0.1:8025") or TcpListen("127.0.0.1", 8025)
    policy = listen("policy", None)
    milter = listen("milter", None)
    mcp = listen("mcp", None)
    listeners = [
        ("lmtp", lmtp),
        ("http", http),
        ("policy", policy),
        ("milter", milter),
        ("mcp", mcp),
    ]
    for index, (key, where) in enumerate(listeners):
        for other, there in listeners[:index]:
            if where is not None and where == there:
                named, same = (key, other) if key in table else (other, key)
                check.error(join(PATH, named), f"{show(str(where))} is also server.{same}")
    return lmtp, http, policy, milter, mcp


def _public_url(check: Checker, table: Mapping[str, Any], http: Listen) -> str:
    where = join(PATH, "public_url")
    if "public_url" in table:
        public_url = check.url(where, check.get(table, PATH, "public_url", str, "http://x"))
        if urlsplit(public_url).query:
            check.error(where, f"{show(public_url)} must not have a query")
    elif isinstance(http, TcpListen):
        public_url = f"http://{http}"
        if http.host in ("0.0.0.0", "::"):  # noqa: S104  (a check, not a bind)
            check.warn(where, f"defaults to {public_url}, which peers cannot reach; set it")
    else:
        check.error(where, "missing: required when server.http is a unix socket")
        public_url = "http://localhost"
    return public_url.rstrip("/")


def _relay(check: Checker, table: Mapping[str, Any]) -> TcpListen:
    relay_text = check.get(table, PATH, "smtp_relay", str, "127.0.0.1:25")
    relay = check.listen(join(PATH, "smtp_relay"), relay_text, min_port=1)
    if isinstance(relay, UnixListen):
        check.error(join(PATH, "smtp_relay"), f"{show(relay_text)} is not host:port")
    return relay if isinstance(relay, TcpListen) else TcpListen("127.0.0.1", 25)


def _trust(check: Checker, table: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``trusted_authserv_ids`` and ``trusted_hosts`` (by default the ids)."""

    def authserv_id(item_path: str, text: str) -> str | None:
        try:
            return ascii_host_name(text)
        except ValueError:
            check.error(item_path, f"{show(text)} is not an authserv-id: {AUTHSERV_ID_RULE}")
            return None

    ids = check.strings(table, PATH, "trusted_authserv_ids", authserv_id)
    if not ids:
        check.warn(
            join(PATH, "trusted_authserv_ids"),
            "empty: no Authentication-Results is trusted, so no mail can be authenticated "
            "and no handoff or reply will be sent (docs/protocol.md §4)",
        )

    def host(item_path: str, text: str) -> str | None:
        if not is_host(text) and not is_ipv6(text):
            check.error(item_path, f"{show(text)} is not a host name")
            return None
        return text.lower()

    if "trusted_hosts" not in table:
        return ids, ids
    return ids, check.strings(table, PATH, "trusted_hosts", host)


def _delimiter(check: Checker, table: Mapping[str, Any]) -> str:
    delimiter = check.get(table, PATH, "recipient_delimiter", str, "+")
    where = join(PATH, "recipient_delimiter")
    if len(delimiter) > 1:
        check.error(where, f'{show(delimiter)} is not one character or ""')
    elif delimiter and not 0x21 <= ord(delimiter) <= 0x7E:
        check.error(where, f"{show(delimiter)} is not a printable ASCII character")
    elif delimiter and (delimiter.isalnum() or delimiter in '-_.=!@"'):
        # A delimiter must not be a character a MAS local part can hold (docs/protocol.md §2:
        # letters, digits, "-", "_", "." in type and id; "=" and "!" separate them).
        check.error(
            where, f"{show(delimiter)} cannot be the delimiter: it can appear in a MAS local part"
        )
    return delimiter


def _limits(check: Checker, table: Mapping[str, Any]) -> dict[str, int]:
    """The positive integers: message size, the listeners' connection caps, feed followers."""
    limits = {}
    for key, default in (
        ("max_message_bytes", 26214400),
        ("max_lmtp_sessions", 100),
        ("max_http_connections", 1000),
        ("max_policy_connections", 100),
        ("max_milter_connections", 100),
        ("max_followers", 100),
    ):
        limits[key] = check.get(table, PATH, key, int, default)
        if limits[key] <= 0:
            check.error(join(PATH, key), f"{limits[key]} is not a positive integer")
    return limits


#: ``server.log_format``: the standard library's line, or one JSON object a line.
LOG_FORMATS: Final = ("text", "json")


def _log_format(check: Checker, table: Mapping[str, Any]) -> str:
    text = check.get(table, PATH, "log_format", str, "text")
    if text not in LOG_FORMATS:
        check.error(join(PATH, "log_format"), f'{show(text)} is not "text" or "json"')
        return "text"
    return text
