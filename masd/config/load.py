"""Reading the file: TOML syntax, the top level and each ``[domains."D"]`` table."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from masd.config.casetypes import parse_type
from masd.config.checker import Checker
from masd.config.dkim import _parse_dkim_keys
from masd.config.model import Config, ConfigErrors, Dkim, DomainConfig, TypeConfig
from masd.config.names import TYPE_NAME, join, normalize_domain, show
from masd.config.server import parse_server
from masd.core.errors import ConfigError

_TOP_KEYS: Final = frozenset({"server", "domains"})
_DOMAIN_KEYS: Final = frozenset({"dkim", "types"})


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


def parse_config(data: Mapping[str, Any], *, base_dir: Path, source: str = "<config>") -> Config:
    """Validate parsed TOML ``data``; relative paths are relative to ``base_dir``.

    Token and key files are read here.  Raises :class:`ConfigErrors` with every
    error found.
    """
    check = Checker(base_dir)
    top = check.table(dict(data), "", _TOP_KEYS)
    server = parse_server(check, check.get(top, "", "server", dict, {}))
    domains: dict[str, DomainConfig] = {}
    written: dict[str, str] = {}  # A-label name -> the key as written
    if "domains" not in top:
        check.error("domains", "missing: at least one domain is required")
    for key, raw in check.get(top, "", "domains", dict, {}).items():
        path = join("domains", key)
        try:
            name = normalize_domain(key)
        except ValueError as exc:
            check.error(path, f"{show(key)} {exc}")
            continue
        if name in written:
            check.error(path, f"{show(key)} is the same domain as {show(written[name])}")
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


def _parse_domain(check: Checker, name: str, raw: object, path: str) -> DomainConfig:
    table = check.table(raw, path, _DOMAIN_KEYS)
    dkim: tuple[Dkim, ...] = ()
    if "dkim" in table:
        dkim = _parse_dkim_keys(check, table["dkim"], join(path, "dkim"))
    types: dict[str, TypeConfig] = {}
    types_path = join(path, "types")
    if "types" not in table:
        check.error(types_path, "missing: a domain needs at least one type")
    for key, type_raw in check.get(table, path, "types", dict, {}).items():
        type_path = join(types_path, key)
        if not TYPE_NAME.fullmatch(key):
            check.error(
                type_path,
                f"{show(key)} is not a type name (a letter, then up to 31 letters, "
                "digits or hyphens; docs/protocol.md §2)",
            )
            continue
        type_name = key.lower()
        if type_name in types:
            check.error(type_path, f"{show(key)} is the type {type_name} again")
            continue
        types[type_name] = parse_type(check, name, type_name, type_raw, type_path)
    if table.get("types") == {}:
        check.error(types_path, "empty: a domain needs at least one type")
    return DomainConfig(name=name, dkim_keys=dkim, types=MappingProxyType(types))
