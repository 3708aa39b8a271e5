"""masd.config: every rule of docs/protocol.md §18 with a good and a bad value."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import given
from hypothesis import strategies as st
from support.keys import pem

from masd.config import (
    Config,
    ConfigErrors,
    Policy,
    SendCap,
    TcpListen,
    UnixListen,
    format_duration,
    format_summary,
    load_config,
    parse_config,
    parse_duration,
    parse_listen,
    webhook_for,
)
from masd.core.errors import ConfigError, MasdError

T = 'domains."help.example".types.ticket'
C = 'domains."help.example".types.case'
EP = f"{T}.endpoints.callback"
TOKENS = {
    "admin.token": "admin-secret-0001",
    "callback.token": "callback-secret-0002",
    "crm.token": "crm-secret-0003",
    "transfer.token": "transfer-secret-0004",
}

PEM = pem(ed25519.Ed25519PrivateKey.generate()).decode()  # a key that signs, in a millisecond
DELETE = object()


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``secrets`` in tmp_path, named from tmp_path as the working directory: an error
    shows at most 80 characters of a value, fewer than a path below pytest's base
    directory may have (``.../popen-gw1/test_bad_value_is_named_domain10/...``)."""
    monkeypatch.chdir(tmp_path)
    directory = Path("secrets")
    directory.mkdir()
    for name, token in TOKENS.items():
        write(directory / name, token + "\n")
    return directory


def base() -> dict[str, Any]:
    return copy.deepcopy(
        {
            "server": {
                "trusted_authserv_ids": ["mx.help.example"],
                "admin_token_file": "admin.token",
            },
            "domains": {
                "help.example": {
                    "types": {
                        "ticket": {
                            "role": "master",
                            "modes": ["callback"],
                            "id_prefix": "gs-",
                            "endpoints": {
                                "callback": {
                                    "url": "http://127.0.0.1:9001/mas",
                                    "token_file": "callback.token",
                                    "deadline": "2h",
                                    "fields": ["phone", "time"],
                                }
                            },
                        },
                        "case": {
                            "role": "slave",
                            "master": {
                                "url": "http://127.0.0.1:9002/mas",
                                "token_file": "crm.token",
                            },
                            "policy": {"autonomous_send": False, "transfers": "block"},
                            "webhooks": [
                                {
                                    "url": "http://127.0.0.1:9003/hooks",
                                    "token_file": "transfer.token",
                                    "fields": ["phone"],
                                }
                            ],
                        },
                    }
                }
            },
        }
    )


def put(data: dict[str, Any], keys: tuple[str | int, ...], value: object) -> dict[str, Any]:
    """Set (or with DELETE, remove) the value at ``keys``; returns ``data``."""
    node: Any = data
    for key in keys[:-1]:
        node = node[key]
    if value is DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


def errors_of(data: dict[str, Any], base_dir: Path) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        parse_config(data, base_dir=base_dir)
    assert all(isinstance(e, ConfigError) for e in caught.value.errors)
    return [str(e) for e in caught.value.errors]


TYPES = ("domains", "help.example", "types")
TICKET = (*TYPES, "ticket")
CASE = (*TYPES, "case")
ENDPOINT = (*TICKET, "endpoints", "callback")


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("2h", 7200), ("3d", 259200), ("1h30m", 5400), ("0s", 0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["2 hours", "", "2H", "h", "1.5h", " 2h", "2h ", "30m1h", "-1s", "2", "\u0663s"]
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration \(30s, 15m, 2h, 3d\)"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=10**8))
def test_format_duration_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


# --------------------------------------------------------------------------- listeners


def test_parse_listen_forms(tmp_path: Path) -> None:
    assert parse_listen("unix:/run/masd/lmtp.sock") == UnixListen(Path("/run/masd/lmtp.sock"))
    assert parse_listen("unix:lmtp.sock", base_dir=tmp_path) == UnixListen(tmp_path / "lmtp.sock")
    assert parse_listen("127.0.0.1:2424") == TcpListen("127.0.0.1", 2424)
    assert parse_listen("[::1]:2424") == TcpListen("::1", 2424)
    assert parse_listen("LocalHost:0") == TcpListen("localhost", 0)
    assert str(TcpListen("::1", 2424)) == "[::1]:2424"
    assert str(UnixListen(Path("/x.sock"))) == "unix:/x.sock"


@pytest.mark.parametrize(
    "text",
    ["", "unix:", "127.0.0.1", "::1:2424", "[127.0.0.1]:25", "a b:25", "1.2.3.999:25", ":25"],
)
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a listener"):
        parse_listen(text)


def test_parse_listen_port_bounds() -> None:
    with pytest.raises(ValueError, match="has port 70000, not in 0-65535"):
        parse_listen("127.0.0.1:70000")
    with pytest.raises(ValueError, match="has port 0, not in 1-65535"):
        parse_listen("127.0.0.1:0", min_port=1)
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        parse_listen("unix:/" + "x" * 120)


# --------------------------------------------------------------------------- a good file


def test_base_config_parses(secrets_dir: Path) -> None:
    config = parse_config(base(), base_dir=secrets_dir, source="test.toml")
    assert config.source == "test.toml"
    assert config.warnings == ()
    ticket = config.type_for("help.example", "ticket")
    assert ticket is not None
    assert ticket.role == "master"
    assert ticket.modes == ("callback",)
    assert ticket.id_prefix == "gs-"
    endpoint = ticket.endpoints["callback"]
    assert (endpoint.domain, endpoint.type, endpoint.mode) == ("help.example", "ticket", "callback")
    assert endpoint.token == TOKENS["callback.token"]
    assert endpoint.deadline == 7200
    assert endpoint.fields == ("phone", "time")
    assert ticket.master is None
    assert ticket.webhooks == ()
    case = config.type_for("HELP.example", "Case")
    assert case is not None
    assert case.master is not None
    assert case.master.token == TOKENS["crm.token"]
    assert case.policy == Policy(autonomous_send=False, transfers="block")
    assert [w.token for w in case.webhooks] == [TOKENS["transfer.token"]]
    assert config.server.admin_token == TOKENS["admin.token"]
    assert config.type_for("help.example", "nope") is None
    assert config.type_for("other.example", "ticket") is None
    assert config.type_for("bad..domain", "ticket") is None


def test_defaults(tmp_path: Path) -> None:
    data = {
        "domains": {
            "help.example": {
                "types": {
                    "ticket": {"role": "master"},
                    "case": {
                        "role": "slave",
                        "master": {"url": "https://crm.example/mas", "token_file": "t"},
                    },
                }
            }
        }
    }
    write(tmp_path / "t", "x-secret")
    config = parse_config(data, base_dir=tmp_path)
    server = config.server
    assert server.lmtp == UnixListen(Path("/run/masd/lmtp.sock"))
    assert server.http == TcpListen("127.0.0.1", 8025)
    assert server.policy is None
    assert server.milter is None
    assert server.max_lmtp_sessions == 100
    assert server.max_http_connections == 1000
    assert (server.max_policy_connections, server.max_milter_connections) == (100, 100)
    assert server.log_format == "text"
    assert server.public_url == "http://127.0.0.1:8025"
    assert server.database == Path("/var/lib/masd/masd.db")
    assert server.smtp_relay == TcpListen("127.0.0.1", 25)
    assert server.trusted_authserv_ids == ()
    assert server.trusted_hosts == ()
    assert server.admin_token is None
    assert server.recipient_delimiter == "+"
    assert server.max_message_bytes == 26214400
    assert server.retry_for == 3 * 86400
    assert server.hostname == "localhost"
    assert config.warnings == (
        "server.trusted_authserv_ids: empty: no Authentication-Results is trusted, so no mail "
        "can be authenticated and no handoff or reply will be sent (docs/protocol.md §4)",
    )
    ticket = config.domains["help.example"].types["ticket"]
    assert ticket.id_prefix == "ticket-"
    assert ticket.acknowledge is True
    assert ticket.require_dmarc_for_handoff is True
    assert ticket.send_cap == SendCap(per_case=20, per_recipient_per_day=10)
    assert ticket.modes == ()
    assert dict(ticket.endpoints) == {}
    case = config.domains["help.example"].types["case"]
    assert case.policy == Policy(autonomous_send=False, transfers="block")
    assert case.webhooks == ()
    assert case.send_cap == SendCap()
    assert case.require_dmarc_for_handoff is True


def test_trusted_hosts_default_to_the_authserv_ids(secrets_dir: Path) -> None:
    data = put(base(), ("server", "trusted_authserv_ids"), ["MX.Help.Example", "mx2.example"])
    config = parse_config(data, base_dir=secrets_dir)
    assert config.server.trusted_authserv_ids == ("mx.help.example", "mx2.example")
    assert config.server.trusted_hosts == ("mx.help.example", "mx2.example")
    put(data, ("server", "trusted_hosts"), ["relay.example", "::1"])
    config = parse_config(data, base_dir=secrets_dir)
    assert config.server.trusted_hosts == ("relay.example", "::1")


def test_explicit_server_values(secrets_dir: Path) -> None:
    data = base()
    data["server"].update(
        {
            "lmtp": "127.0.0.1:2424",
            "http": "unix:http.sock",
            "policy": "[::1]:10040",
            "milter": "unix:milter.sock",
            "max_lmtp_sessions": 7,
            "max_http_connections": 9,
            "max_policy_connections": 11,
            "max_milter_connections": 13,
            "log_format": "json",
            "public_url": "https://masd.help.example/base/",
            "database": "db/masd.db",
            "smtp_relay": "relay.example:587",
            "recipient_delimiter": "",
            "max_message_bytes": 1000,
            "retry_for": "1h30m",
            "hostname": "MX.Help.Example",
        }
    )
    server = parse_config(data, base_dir=secrets_dir).server
    assert server.lmtp == TcpListen("127.0.0.1", 2424)
    assert server.http == UnixListen(secrets_dir / "http.sock")
    assert server.policy == TcpListen("::1", 10040)
    assert server.milter == UnixListen(secrets_dir / "milter.sock")
    assert (server.max_lmtp_sessions, server.max_http_connections) == (7, 9)
    assert (server.max_policy_connections, server.max_milter_connections) == (11, 13)
    assert server.log_format == "json"
    assert server.public_url == "https://masd.help.example/base"
    assert server.database == secrets_dir / "db/masd.db"
    assert server.smtp_relay == TcpListen("relay.example", 587)
    assert server.recipient_delimiter == ""
    assert server.max_message_bytes == 1000
    assert server.retry_for == 5400
    assert server.hostname == "mx.help.example"


def test_idna_domains_become_a_labels(secrets_dir: Path) -> None:
    data = base()
    data["domains"] = {"Bücher.Example": data["domains"]["help.example"]}
    config = parse_config(data, base_dir=secrets_dir)
    assert list(config.domains) == ["xn--bcher-kva.example"]
    assert config.domains["xn--bcher-kva.example"].name == "xn--bcher-kva.example"
    assert config.type_for("bücher.example", "ticket") is not None
    assert config.type_for("XN--BCHER-KVA.example", "ticket") is not None
    endpoint = config.domains["xn--bcher-kva.example"].types["ticket"].endpoints["callback"]
    assert endpoint.domain == "xn--bcher-kva.example"


def test_type_for_finds_one_type_under_every_spelling(secrets_dir: Path) -> None:
    data = base()
    data["domains"] = {"Bücher.Example": data["domains"]["help.example"]}
    config = parse_config(data, base_dir=secrets_dir)
    ticket = config.domains["xn--bcher-kva.example"].types["ticket"]
    for domain in ("xn--bcher-kva.example", "XN--Bcher-KVA.example", "BÜCHER.example"):
        for type_ in ("ticket", "Ticket"):
            assert config.type_for(domain, type_) is ticket
    for domain in ("xn--bcher-kva.example.", " xn--bcher-kva.example", "", "xn--zz.example"):
        assert config.type_for(domain, "ticket") is None


def test_type_and_mode_names_are_lowercased(secrets_dir: Path) -> None:
    data = base()
    types = data["domains"]["help.example"]["types"]
    types["Ticket"] = types.pop("ticket")
    types["Ticket"]["modes"] = ["CallBack"]
    types["Ticket"]["endpoints"] = {"Callback": types["Ticket"]["endpoints"]["callback"]}
    types["Ticket"]["endpoints"]["Callback"]["fields"] = ["Phone"]
    ticket = parse_config(data, base_dir=secrets_dir).domains["help.example"].types["ticket"]
    assert ticket.name == "ticket"
    assert ticket.modes == ("callback",)
    assert list(ticket.endpoints) == ["callback"]
    assert ticket.endpoints["callback"].fields == ("phone",)


def test_values_are_immutable_and_secrets_stay_out_of_repr(secrets_dir: Path) -> None:
    config = parse_config(base(), base_dir=secrets_dir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.hostname = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.domains["x"] = config.domains["help.example"]  # type: ignore[index]
    ticket = config.domains["help.example"].types["ticket"]
    with pytest.raises(TypeError):
        ticket.endpoints["sms"] = ticket.endpoints["callback"]  # type: ignore[index]
    text = repr(config)
    for token in TOKENS.values():
        assert token not in text


def test_slave_policy_webhook(secrets_dir: Path) -> None:
    data = put(
        base(),
        (*CASE, "policy"),
        {"autonomous_send": True, "transfers": {"webhook": "http://127.0.0.1:9003/hooks/a"}},
    )
    case = parse_config(data, base_dir=secrets_dir).domains["help.example"].types["case"]
    assert case.policy == Policy(autonomous_send=True, transfers="http://127.0.0.1:9003/hooks/a")


def test_a_shared_service_may_serve_two_types_with_one_secret(secrets_dir: Path) -> None:
    data = base()
    types = data["domains"]["help.example"]["types"]
    types["order"] = copy.deepcopy(types["ticket"])
    config = parse_config(data, base_dir=secrets_dir)
    assert (
        config.domains["help.example"].types["order"].endpoints["callback"].token
        == (TOKENS["callback.token"])
    )


def test_relative_paths_are_relative_to_the_config_file(
    secrets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = (secrets_dir / "etc").absolute()
    conf.mkdir()
    write(conf / "masd.toml", EXAMPLE_TOML)
    for name in TOKENS:
        (secrets_dir / name).rename(conf / name)
    elsewhere = secrets_dir / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config("../etc/masd.toml")
    assert config.source == "../etc/masd.toml"
    assert config.server.database == conf / "masd.db"
    assert config.server.admin_token == TOKENS["admin.token"]


# --------------------------------------------------------------------------- bad values

BAD: list[tuple[tuple[str | int, ...], object, str]] = [
    # server
    (
        ("server", "lmtp"),
        "::1:2424",
        'server.lmtp: "::1:2424" is not a listener (unix:/path, '
        "host:port or [ipv6]:port): put an IPv6 address in brackets",
    ),
    (("server", "lmtp"), 2424, "server.lmtp: 2424 is not a string"),
    (
        ("server", "http"),
        "127.0.0.1:70000",
        'server.http: "127.0.0.1:70000" has port 70000, not in 0-65535',
    ),
    (("server", "policy"), "127.0.0.1:8025", 'server.policy: "127.0.0.1:8025" is also server.http'),
    (("server", "lmtp"), "127.0.0.1:8025", 'server.lmtp: "127.0.0.1:8025" is also server.http'),
    (
        ("server", "policy"),
        "localhost",
        'server.policy: "localhost" is not a listener (unix:/path, host:port or [ipv6]:port)',
    ),
    (
        ("server", "public_url"),
        "ftp://x/",
        'server.public_url: "ftp://x/" is not an absolute http or https URL',
    ),
    (
        ("server", "public_url"),
        "http://h/?a=1",
        'server.public_url: "http://h/?a=1" must not have a query',
    ),
    (("server", "database"), "", 'server.database: "" is not a file name'),
    (
        ("server", "database"),
        "postgresql://masd:hunter2@db.internal/masd",
        "server.database: holds a password, which is refused in the URI: put it in "
        "server.database_password_file (mode 0600), or use libpq's .pgpass",
    ),
    (
        ("server", "database"),
        "mysql://masd@db.internal/masd",
        'server.database: "mysql://..." is not a store: give an SQLite file path or a '
        "postgresql:// URI",
    ),
    (
        ("server", "claim_timeout"),
        "soon",
        'server.claim_timeout: "soon" is not a duration (30s, 15m, 2h, 3d)',
    ),
    (("server", "smtp_relay"), "unix:/run/x", 'server.smtp_relay: "unix:/run/x" is not host:port'),
    (
        ("server", "smtp_relay"),
        "127.0.0.1:0",
        'server.smtp_relay: "127.0.0.1:0" has port 0, not in 1-65535',
    ),
    (
        ("server", "trusted_authserv_ids"),
        "mx.help.example",
        'server.trusted_authserv_ids: "mx.help.example" is not an array',
    ),
    (
        ("server", "trusted_authserv_ids"),
        ["mx;x"],
        'server.trusted_authserv_ids[0]: "mx;x" is not an authserv-id: give the host name '
        "your authenticator writes first in Authentication-Results (letters, digits and "
        "hyphens in dot-separated labels, as RFC 8601 recommends)",
    ),
    (
        ("server", "trusted_authserv_ids"),
        ["a", 1],
        "server.trusted_authserv_ids[1]: 1 is not a string",
    ),
    (
        ("server", "trusted_authserv_ids"),
        ["a", "A"],
        'server.trusted_authserv_ids[1]: "A" is listed twice',
    ),
    (
        ("server", "trusted_hosts"),
        ["bad host"],
        'server.trusted_hosts[0]: "bad host" is not a host name',
    ),
    (
        ("server", "admin_token_file"),
        "missing.token",
        'server.admin_token_file: cannot read "{dir}/missing.token": No such file or directory',
    ),
    (
        ("server", "recipient_delimiter"),
        "+-",
        'server.recipient_delimiter: "+-" is not one character or ""',
    ),
    (
        ("server", "recipient_delimiter"),
        "-",
        'server.recipient_delimiter: "-" cannot be the '
        "delimiter: it can appear in a MAS local part",
    ),
    (
        ("server", "recipient_delimiter"),
        " ",
        'server.recipient_delimiter: " " is not a printable ASCII character',
    ),
    (("server", "max_message_bytes"), 0, "server.max_message_bytes: 0 is not a positive integer"),
    (("server", "max_message_bytes"), True, "server.max_message_bytes: true is not an integer"),
    (("server", "max_message_bytes"), 1.5, "server.max_message_bytes: 1.5 is not an integer"),
    (
        ("server", "retry_for"),
        "3 days",
        'server.retry_for: "3 days" is not a duration (30s, 15m, 2h, 3d)',
    ),
    (("server", "retry_for"), "0s", 'server.retry_for: "0s" is not longer than zero'),
    (("server", "hostname"), "bad_host", 'server.hostname: "bad_host" is not an ASCII host name'),
    (("server", "colour"), "blue", "server.colour: unknown key"),
    (("server",), ["x"], "server: an array is not a table"),
    (("extra",), 1, "extra: unknown key"),
    # domains
    (("domains",), {}, "domains: empty: at least one domain is required"),
    (("domains",), DELETE, "domains: missing: at least one domain is required"),
    (
        ("domains", "bad_domain.example"),
        {"types": {}},
        'domains."bad_domain.example": "bad_domain.example" has a bad label "bad_domain" '
        "(letters, digits and inner hyphens)",
    ),
    (
        ("domains", "HELP.example"),
        {"types": {"x": {"role": "master"}}},
        'domains."HELP.example": "HELP.example" is the same domain as "help.example"',
    ),
    (
        ("domains", "other.example"),
        {},
        'domains."other.example".types: missing: a domain needs at least one type',
    ),
    (
        ("domains", "other.example"),
        {"types": {}},
        'domains."other.example".types: empty: a domain needs at least one type',
    ),
    (("domains", "help.example", "mx"), 1, 'domains."help.example".mx: unknown key'),
    (
        ("domains", "help.example", "dkim"),
        "mas",
        'domains."help.example".dkim: "mas" is not a table',
    ),
    (
        ("domains", "help.example", "dkim"),
        {"selector": "mas"},
        'domains."help.example".dkim.key_file: missing: a string is required here',
    ),
    (
        ("domains", "help.example", "dkim"),
        {"selector": "a_b", "key_file": "dkim.key"},
        'domains."help.example".dkim.selector: "a_b" is not a DNS label',
    ),
    (
        ("domains", "help.example", "dkim"),
        {"selector": "mas", "key_file": "admin.token"},
        'domains."help.example".dkim.key_file: "{dir}/admin.token" is not a PEM private key',
    ),
    (
        ("domains", "help.example", "dkim"),
        {"selector": "mas", "key_file": "nokey"},
        'domains."help.example".dkim.key_file: cannot read "{dir}/nokey": No such file or '
        "directory",
    ),
    # types
    (
        (*TYPES, "1ticket"),
        {"role": "master"},
        'domains."help.example".types.1ticket: "1ticket" is not a type name (a letter, then up to '
        "31 letters, digits or hyphens; docs/protocol.md §2)",
    ),
    (
        (*TYPES, "t" * 33),
        {"role": "master"},
        f'domains."help.example".types.{"t" * 33}: "{"t" * 33}" is not a type name (a letter, '
        "then up to 31 letters, digits or hyphens; docs/protocol.md §2)",
    ),
    (
        (*TYPES, "Ticket"),
        {"role": "master"},
        'domains."help.example".types.Ticket: "Ticket" is the type ticket again',
    ),
    ((*TICKET, "role"), "boss", f'{T}.role: "boss" is not "master" or "slave"'),
    ((*TICKET, "role"), DELETE, f"{T}.role: missing: a string is required here"),
    ((*TICKET, "mdoes"), ["x"], f"{T}.mdoes: unknown key, did you mean modes?"),
    (
        (*TICKET, "require_dmarc_for_handoff"),
        "yes",
        f'{T}.require_dmarc_for_handoff: "yes" is not a boolean (true or false)',
    ),
    ((*TICKET, "acknowledge"), 1, f"{T}.acknowledge: 1 is not a boolean (true or false)"),
    ((*TICKET, "send_cap"), {"per_case": 0}, f"{T}.send_cap.per_case: 0 is not a positive integer"),
    (
        (*TICKET, "send_cap"),
        {"per_recipient_per_day": -1},
        f"{T}.send_cap.per_recipient_per_day: -1 is not a positive integer",
    ),
    (
        (*TICKET, "send_cap"),
        {"per_day": 1},
        f"{T}.send_cap.per_day: unknown key, did you mean per_recipient_per_day?",
    ),
    ((*TICKET, "send_cap"), 5, f"{T}.send_cap: 5 is not a table"),
    # master-role rules
    (
        (*TICKET, "modes"),
        ["callback", "1x"],
        f'{T}.modes[1]: "1x" is not a mode name (a letter, then up to 15 letters, digits or '
        "hyphens; docs/protocol.md §2)",
    ),
    (
        (*TICKET, "modes"),
        ["callback", "m" * 17],
        f'{T}.modes[1]: "{"m" * 17}" is not a mode name (a letter, then up to 15 letters, digits '
        "or hyphens; docs/protocol.md §2)",
    ),
    ((*TICKET, "modes"), ["callback", "Callback"], f'{T}.modes[1]: "Callback" is listed twice'),
    (
        (*TICKET, "id_prefix"),
        "gs/",
        f'{T}.id_prefix: "gs/" is not made of id characters '
        "(letters, digits, -, _ and inner single dots; docs/protocol.md §2)",
    ),
    (
        (*TICKET, "id_prefix"),
        ".gs",
        f'{T}.id_prefix: ".gs" is not made of id characters '
        "(letters, digits, -, _ and inner single dots; docs/protocol.md §2)",
    ),
    (
        (*TICKET, "id_prefix"),
        "g..s",
        f'{T}.id_prefix: "g..s" is not made of id characters '
        "(letters, digits, -, _ and inner single dots; docs/protocol.md §2)",
    ),
    (
        (*TICKET, "id_prefix"),
        "p" * 31,
        f'{T}.id_prefix: "{"p" * 31}" is too long: ticket='
        f"{'p' * 31} and a 10-digit number must fit in 47 octets (docs/protocol.md §2)",
    ),
    (
        (*TICKET, "master"),
        {},
        f"{T}.master: not allowed in a master type (in the master role email owns the case)",
    ),
    (
        (*TICKET, "policy"),
        {},
        f"{T}.policy: not allowed in a master type (case policy comes "
        "from an outside master, in the slave role)",
    ),
    (
        (*TICKET, "webhooks"),
        [],
        f"{T}.webhooks: not allowed in a master type (a master type hands off to its endpoints)",
    ),
    (
        (*TICKET, "endpoints", "sms"),
        {"url": "http://x/", "token_file": "t", "deadline": "1h"},
        f'{T}.endpoints.sms: "sms" is not in modes, so this endpoint could never be used (a '
        "handoff to it is refused with mode-not-enabled, docs/protocol.md §4)",
    ),
    (
        (*TICKET, "endpoints", "Callback"),
        {},
        f'{T}.endpoints.Callback: "Callback" is the endpoint for callback again',
    ),
    (
        (*TICKET, "endpoints", "9x"),
        {},
        f'{T}.endpoints.9x: "9x" is not a mode name (a letter, '
        "then up to 15 letters, digits or hyphens; docs/protocol.md §2)",
    ),
    (
        (*ENDPOINT, "url"),
        "ftp://x/mas",
        f'{EP}.url: "ftp://x/mas" is not an absolute http or https URL',
    ),
    ((*ENDPOINT, "url"), "/mas", f'{EP}.url: "/mas" is not an absolute http or https URL'),
    (
        (*ENDPOINT, "url"),
        "http://u:pw@127.0.0.1/mas",
        f'{EP}.url: "http://u:pw@127.0.0.1/mas" must not carry credentials (secrets live in token '
        "files)",
    ),
    (
        (*ENDPOINT, "url"),
        "http://127.0.0.1:99999/",
        f'{EP}.url: "http://127.0.0.1:99999/" has a bad port',
    ),
    ((*ENDPOINT, "url"), "http://h/#top", f'{EP}.url: "http://h/#top" must not have a fragment'),
    ((*ENDPOINT, "url"), DELETE, f"{EP}.url: missing: a string is required here"),
    ((*ENDPOINT, "token_file"), DELETE, f"{EP}.token_file: missing: a string is required here"),
    ((*ENDPOINT, "deadline"), DELETE, f"{EP}.deadline: missing: a string is required here"),
    (
        (*ENDPOINT, "deadline"),
        "2 hours",
        f'{EP}.deadline: "2 hours" is not a duration (30s, 15m, 2h, 3d)',
    ),
    ((*ENDPOINT, "deadline"), 7200, f"{EP}.deadline: 7200 is not a string"),
    (
        (*ENDPOINT, "fields"),
        ["phone", "a b"],
        f'{EP}.fields[1]: "a b" is not a field name (letters, digits, - and _; up to 64)',
    ),
    (
        (*ENDPOINT, "fields"),
        ["Subject"],
        f'{EP}.fields[0]: "subject" is always in the details; it is not a field',
    ),
    ((*ENDPOINT, "fields"), "phone", f'{EP}.fields: "phone" is not an array'),
    ((*ENDPOINT, "retries"), 3, f"{EP}.retries: unknown key"),
    ((*ENDPOINT,), "http://x/", f'{EP}: "http://x/" is not a table'),
    # slave-role rules
    (
        (*CASE, "modes"),
        ["callback"],
        f"{C}.modes: not allowed in a slave type "
        "(modes do not apply to slave types, docs/protocol.md §13)",
    ),
    (
        (*CASE, "endpoints"),
        {},
        f"{C}.endpoints: not allowed in a slave type (a slave type hands "
        "off to the webhook its case policy names)",
    ),
    (
        (*CASE, "acknowledge"),
        True,
        f"{C}.acknowledge: not allowed in a slave type (in the slave "
        "role email mails only on mail.send or under autonomous_send)",
    ),
    (
        (*CASE, "id_prefix"),
        "c-",
        f"{C}.id_prefix: not allowed in a slave type (in the slave "
        "role case ids come from the master's case.assign)",
    ),
    (
        (*CASE, "master"),
        DELETE,
        f"{C}.master: missing: a slave type needs its master ({{url, token_file}})",
    ),
    ((*CASE, "master"), "http://x/", f'{C}.master: "http://x/" is not a table'),
    (
        (*CASE, "master", "url"),
        "nope",
        f'{C}.master.url: "nope" is not an absolute http or https URL',
    ),
    (
        (*CASE, "master", "token"),
        "inline",
        f"{C}.master.token: unknown key, did you mean token_file?",
    ),
    (
        (*CASE, "master", "token_file"),
        "empty.token",
        f'{C}.master.token_file: "{{dir}}/empty.token" is empty',
    ),
    (
        (*CASE, "master", "token_file"),
        "twoword.token",
        f'{C}.master.token_file: "{{dir}}/twoword.token" must hold one secret of printable ASCII '
        "without spaces (it is sent in an Authorization header)",
    ),
    (
        (*CASE, "master", "token_file"),
        ".",
        f'{C}.master.token_file: "{{dir}}" is not a regular file',
    ),
    (
        (*CASE, "policy"),
        {"autonomous_send": "no"},
        f'{C}.policy.autonomous_send: "no" is not a boolean (true or false)',
    ),
    (
        (*CASE, "policy"),
        {"transfers": "allow"},
        f'{C}.policy.transfers: "allow" is not "block" or {{webhook = URL}}',
    ),
    (
        (*CASE, "policy"),
        {"transfers": {"webhook": "http://127.0.0.1:9003/hooks", "url": "http://x/"}},
        f"{C}.policy.transfers.url: unknown key",
    ),
    (
        (*CASE, "policy"),
        {"transfers": {"webhook": "http://127.0.0.1:9004/hooks"}},
        f'{C}.policy.transfers.webhook: "http://127.0.0.1:9004/hooks" is not under any webhooks '
        "url (same scheme, host and port, and a path under its path; docs/protocol.md §18)",
    ),
    (
        (*CASE, "policy"),
        {"transfers": {"webhook": "http://127.0.0.1:9003/hooksx"}},
        f'{C}.policy.transfers.webhook: "http://127.0.0.1:9003/hooksx" is not under any webhooks '
        "url (same scheme, host and port, and a path under its path; docs/protocol.md §18)",
    ),
    (
        (*CASE, "policy"),
        {"transfers": {"webhook": "mailto:x@y"}},
        f'{C}.policy.transfers.webhook: "mailto:x@y" is not an absolute http or https URL',
    ),
    ((*CASE, "webhooks"), {"url": "http://x/"}, f"{C}.webhooks: a table is not an array"),
    ((*CASE, "webhooks", 0, "url"), 5, f"{C}.webhooks[0].url: 5 is not a string"),
    (
        (*CASE, "webhooks", 0, "token_file"),
        DELETE,
        f"{C}.webhooks[0].token_file: missing: a string is required here",
    ),
    (
        (*CASE, "webhooks", 0, "fields"),
        [""],
        f'{C}.webhooks[0].fields[0]: "" is not a field name (letters, digits, - and _; up to 64)',
    ),
    ((*CASE, "webhooks", 0, "deadline"), "1h", f"{C}.webhooks[0].deadline: unknown key"),
    # one secret, one peer
    (
        (*CASE, "master", "token_file"),
        "callback.token",
        f"{C}.master.token_file: holds the same secret as {EP}.token_file (the mode at "
        "http://127.0.0.1:9001/mas); each peer needs its own secret, because the secret is its "
        "identity",
    ),
    (
        (*ENDPOINT, "token_file"),
        "admin.token",
        f"{EP}.token_file: holds the same secret as server.admin_token_file (the admin secret); "
        "each peer needs its own secret, because the secret is its identity",
    ),
]

BAD += [
    (("server", "max_lmtp_sessions"), 0, "server.max_lmtp_sessions: 0 is not a positive integer"),
    (
        ("server", "max_http_connections"),
        -1,
        "server.max_http_connections: -1 is not a positive integer",
    ),
    (
        ("server", "max_policy_connections"),
        0,
        "server.max_policy_connections: 0 is not a positive integer",
    ),
    (
        ("server", "max_milter_connections"),
        "9",
        'server.max_milter_connections: "9" is not an integer',
    ),
    (("server", "log_format"), "xml", 'server.log_format: "xml" is not "text" or "json"'),
    (
        ("server", "milter"),
        "127.0.0.1:8025",
        'server.milter: "127.0.0.1:8025" is also server.http',
    ),
]

BAD += [
    (
        ("domains", "help.example", "dkim"),
        [],
        'domains."help.example".dkim: empty: give one key table, or leave dkim out',
    ),
    (
        ("domains", "help.example", "dkim"),
        [{"selector": "a", "key_file": "dkim.key"}, {"selector": "a", "key_file": "dkim.key"}],
        'domains."help.example".dkim[1].selector: "a" is used twice',
    ),
    (
        ("domains", "help.example", "dkim"),
        [{"selector": "a", "key_file": "dkim.key"}, "b"],
        'domains."help.example".dkim[1]: "b" is not a table',
    ),
]


def test_dkim_keys_sign_together(secrets_dir: Path) -> None:
    write(secrets_dir / "dkim.key", PEM)
    keys = [{"selector": "rsa", "key_file": "dkim.key"}, {"selector": "ed", "key_file": "dkim.key"}]
    domain = parse_config(
        put(base(), ("domains", "help.example", "dkim"), keys), base_dir=secrets_dir
    ).domains["help.example"]
    assert [key.selector for key in domain.dkim_keys] == ["rsa", "ed"]
    assert domain.dkim == domain.dkim_keys[0]
    bare = parse_config(base(), base_dir=secrets_dir).domains["help.example"]
    assert (bare.dkim_keys, bare.dkim) == ((), None)


@pytest.mark.parametrize(("keys", "value", "message"), BAD, ids=[m for _, _, m in BAD])
def test_bad_value_is_named(
    secrets_dir: Path, keys: tuple[str | int, ...], value: object, message: str
) -> None:
    write(secrets_dir / "empty.token", " \n\t\n")
    write(secrets_dir / "twoword.token", "two words\n")
    write(secrets_dir / "t", "a-secret-for-t")
    write(secrets_dir / "dkim.key", PEM)
    errors = errors_of(put(base(), keys, value), secrets_dir)
    assert errors == [message.replace("{dir}", str(secrets_dir))]


def test_a_key_that_cannot_sign_is_named_by_check_config(secrets_dir: Path) -> None:
    cases = {
        "truncated": (PEM[:90] + "\n-----END PRIVATE KEY-----\n", "is not a usable key: "),
        "encrypted": (
            pem(ed25519.Ed25519PrivateKey.generate(), b"secret"),
            "is encrypted: masd reads keys without a passphrase",
        ),
        "short RSA": (
            subprocess.run(["openssl", "genrsa", "512"], check=True, capture_output=True).stdout,
            "is an RSA key of 512 bits; at least 1024 needed",
        ),
        "EC": (pem(ec.generate_private_key(ec.SECP256R1())), "; DKIM signs with RSA or Ed25519"),
    }
    for name, (data, why) in cases.items():
        key = secrets_dir / f"{name}.key"
        key.write_bytes(data if isinstance(data, bytes) else data.encode())
        dkim = {"selector": "mas", "key_file": key.name}
        [error] = errors_of(put(base(), ("domains", "help.example", "dkim"), dkim), secrets_dir)
        assert error.startswith(f'domains."help.example".dkim.key_file: "{key}" '), name
        assert why in error, (name, error)


def test_config_errors_is_a_named_refusal(secrets_dir: Path) -> None:
    with pytest.raises(MasdError) as caught:
        parse_config(put(base(), (*TICKET, "role"), "boss"), base_dir=secrets_dir, source="x")
    assert caught.value.code == "bad-config"
    assert isinstance(caught.value, ConfigErrors)
    assert caught.value.errors[0].path == f"{T}.role"
    assert str(caught.value) == (
        f'bad-config: x: 1 error\n{T}.role: "boss" is not "master" or "slave"'
    )


def test_every_error_is_collected_in_file_order(secrets_dir: Path) -> None:
    data = base()
    put(data, ("server", "retry_for"), "soon")
    put(data, (*TICKET, "role"), "boss")
    put(data, (*ENDPOINT, "deadline"), "2 hours")  # checked though the role is unknown
    put(data, (*CASE, "master", "url"), "ftp://crm/")
    put(data, (*CASE, "webhooks", 0, "fields"), ["ok", "not ok"])
    put(data, (*CASE, "policy", "transfers"), {"webhook": "http://evil.example/"})
    assert errors_of(data, secrets_dir) == [
        'server.retry_for: "soon" is not a duration (30s, 15m, 2h, 3d)',
        f'{T}.role: "boss" is not "master" or "slave"',
        f'{EP}.deadline: "2 hours" is not a duration (30s, 15m, 2h, 3d)',
        f'{C}.master.url: "ftp://crm/" is not an absolute http or https URL',
        f'{C}.webhooks[0].fields[1]: "not ok" is not a field name (letters, digits, - and _; '
        "up to 64)",
        f'{C}.policy.transfers.webhook: "http://evil.example/" is not under any webhooks url '
        "(same scheme, host and port, and a path under its path; docs/protocol.md §18)",
    ]


def test_public_url_is_required_with_a_unix_http_listener(secrets_dir: Path) -> None:
    data = put(base(), ("server", "http"), "unix:/run/masd/http.sock")
    assert errors_of(data, secrets_dir) == [
        "server.public_url: missing: required when server.http is a unix socket"
    ]


# --------------------------------------------------------------------------- warnings


def test_group_readable_secret_is_a_warning(secrets_dir: Path) -> None:
    (secrets_dir / "crm.token").chmod(0o644)
    config = parse_config(base(), base_dir=secrets_dir)
    assert config.warnings == (
        f"{C}.master.token_file: {secrets_dir / 'crm.token'} is readable by group or others "
        "(mode 0644); chmod 600 it",
    )


def test_world_readable_dkim_key_is_a_warning(secrets_dir: Path) -> None:
    write(secrets_dir / "dkim.key", PEM, mode=0o604)
    data = put(
        base(), ("domains", "help.example", "dkim"), {"selector": "mas", "key_file": "dkim.key"}
    )
    config = parse_config(data, base_dir=secrets_dir)
    dkim = config.domains["help.example"].dkim
    assert dkim is not None
    assert (dkim.selector, dkim.key_file, dkim.key) == (
        "mas",
        secrets_dir / "dkim.key",
        PEM.encode(),
    )
    assert "-----BEGIN" not in repr(dkim)
    assert config.warnings == (
        f'domains."help.example".dkim.key_file: {secrets_dir / "dkim.key"} is readable by group '
        "or others (mode 0604); chmod 600 it",
    )


def test_mode_without_endpoint_is_a_warning(secrets_dir: Path) -> None:
    data = put(base(), (*TICKET, "modes"), ["callback", "sms"])
    config = parse_config(data, base_dir=secrets_dir)
    assert config.warnings == (
        f'{T}.modes: "sms" has no endpoint: a handoff to it is refused with mode-unavailable '
        "(docs/protocol.md §4)",
    )
    assert config.domains["help.example"].types["ticket"].modes == ("callback", "sms")


def test_wildcard_http_listener_warns_about_public_url(secrets_dir: Path) -> None:
    data = put(base(), ("server", "http"), "0.0.0.0:8025")
    config = parse_config(data, base_dir=secrets_dir)
    assert config.warnings == (
        "server.public_url: defaults to http://0.0.0.0:8025, which peers cannot reach; set it",
    )


# --------------------------------------------------------------------------- webhook_for


@pytest.fixture
def hooked(secrets_dir: Path) -> Config:
    data = base()
    put(
        data,
        (*CASE, "webhooks"),
        [
            {"url": "http://127.0.0.1:9003/hooks", "token_file": "transfer.token"},
            {"url": "https://Transfer.Example/", "token_file": "t"},
        ],
    )
    write(secrets_dir / "t", "another-secret")
    return parse_config(data, base_dir=secrets_dir)


@pytest.mark.parametrize(
    ("url", "index"),
    [
        ("http://127.0.0.1:9003/hooks", 0),
        ("http://127.0.0.1:9003/hooks/", 0),
        ("http://127.0.0.1:9003/hooks/a/b?x=1", 0),
        ("HTTP://127.0.0.1:9003/hooks/a", 0),
        ("https://transfer.example/", 1),
        ("https://transfer.example", 1),
        ("https://transfer.example:443/any/path", 1),
        ("https://TRANSFER.example/x", 1),
    ],
)
def test_webhook_for_matches(hooked: Config, url: str, index: int) -> None:
    case = hooked.domains["help.example"].types["case"]
    assert webhook_for(case, url) is case.webhooks[index]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9003/hooksx",  # not at a "/" boundary
        "http://127.0.0.1:9003/hook",
        "http://127.0.0.1:9003/",  # above the allowed path
        "http://127.0.0.1:9004/hooks",  # other port
        "https://127.0.0.1:9003/hooks",  # other scheme
        "http://localhost:9003/hooks",  # other host
        "http://transfer.example/",  # https only
        "https://transfer.example:8443/",
        "http://127.0.0.1:9003/hooks/../admin",
        "http://127.0.0.1:9003/hooks/%2e%2e/admin",
        "http://127.0.0.1:9003/hooks/./x",
        "http://u:p@127.0.0.1:9003/hooks",
        "http://127.0.0.1:9003/hooks#x",
        "ftp://127.0.0.1:9003/hooks",
        "not a url",
        "http://[127.0.0.1:9003/hooks",  # urlsplit raises: an unclosed IPv6 bracket
        "http://127.0.0.1]:9003/hooks",
    ],
)
def test_webhook_for_refuses(hooked: Config, url: str) -> None:
    case = hooked.domains["help.example"].types["case"]
    assert webhook_for(case, url) is None


def test_webhook_for_a_master_type_is_none(hooked: Config) -> None:
    ticket = hooked.domains["help.example"].types["ticket"]
    assert webhook_for(ticket, "http://127.0.0.1:9003/hooks") is None


# --------------------------------------------------------------------------- files

EXAMPLE_TOML = """\
[server]
trusted_authserv_ids = ["mx.help.example"]
admin_token_file = "admin.token"
database = "masd.db"

[domains."help.example".types.ticket]
role = "master"
modes = ["callback"]

[domains."help.example".types.ticket.endpoints.callback]
url = "http://127.0.0.1:9001/mas"
token_file = "callback.token"
deadline = "2h"
"""


def test_load_config_reads_a_file(secrets_dir: Path) -> None:
    path = write(secrets_dir / "masd.toml", EXAMPLE_TOML)
    config = load_config(path)
    assert config.source == str(path)
    assert config.server.database == secrets_dir.absolute() / "masd.db"
    assert "help.example" in format_summary(config)


def test_bad_toml_is_one_error_naming_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "masd.toml", '[server]\nlmtp = "x"\nhttp = nope\n')
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    assert [str(e) for e in caught.value.errors] == [f"{path}:3:8: invalid TOML: Invalid value"]


def test_bad_toml_at_end_of_document(tmp_path: Path) -> None:
    path = write(tmp_path / "masd.toml", '[server]\nlmtp = "x')
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    assert [str(e) for e in caught.value.errors] == [
        f"{path}:2:10: invalid TOML: Unterminated string"
    ]


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "masd.toml"
    path.write_bytes(b"[server]\n# caf\xe9\n")
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    assert [str(e) for e in caught.value.errors] == [
        f"{path}:2: invalid TOML: the file is not UTF-8"
    ]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    assert [str(e) for e in caught.value.errors] == [
        f"{path}: cannot read: No such file or directory"
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_token_is_an_error(secrets_dir: Path) -> None:
    (secrets_dir / "crm.token").chmod(0o000)
    assert errors_of(base(), secrets_dir) == [
        f'{C}.master.token_file: cannot read "{secrets_dir / "crm.token"}": Permission denied'
    ]
