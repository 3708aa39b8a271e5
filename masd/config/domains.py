"""``[domains."D"]`` tables: in the main file, or one to a file in ``server.domains_dir``.

A domain file ``<domain>.toml`` holds the body of one ``[domains."<domain>"]``
table (its ``dkim``, ``types``, …); its name is its domain.  Errors in it name
the file and the key path the table would have in the main file.  Relative
paths in it are relative to its own directory.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from masd.config.casetypes import parse_type
from masd.config.checker import Checker
from masd.config.dkim import _parse_dkim_keys
from masd.config.model import ConfigErrors, Dkim, DomainConfig, ServerConfig, TypeConfig
from masd.config.names import TYPE_NAME, join, normalize_domain, show
from masd.core.errors import ConfigError

_DOMAIN_KEYS: Final = frozenset({"dkim", "types"})
#: The suffix of a domain file; other files in the directory are not read.
SUFFIX: Final = ".toml"


def read_toml(file: Path, source: str) -> dict[str, Any]:
    """The parsed TOML of ``file``; :class:`ConfigErrors` naming ``source`` if it cannot be."""
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
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigErrors([_syntax_error(source, text, exc)], source=source) from None


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


def domain_files(check: Checker, server: ServerConfig) -> Iterator[tuple[str, Path, object]]:
    """``(domain as written, file, table body)`` for each ``*.toml`` of ``server.domains_dir``.

    A missing directory is an error only when ``server.domains_dir`` was set;
    a file that cannot be read or parsed is an error naming it.
    """
    folder = server.domains_dir
    if folder is None:
        return
    try:
        names = sorted(entry.name for entry in os.scandir(folder))
    except FileNotFoundError:
        if server.domains_dir_set:
            check.error("server.domains_dir", f"{show(str(folder))}: no such directory")
        return
    except OSError as exc:
        check.error("server.domains_dir", f"cannot read {show(str(folder))}: {exc.strerror}")
        return
    for name in names:
        if name.startswith(".") or not name.endswith(SUFFIX):
            continue  # editor and package manager leftovers, READMEs
        file = folder / name
        try:
            body: object = read_toml(file, str(file))
        except ConfigErrors as exc:
            check.errors.extend(exc.errors)
            continue
        yield name[: -len(SUFFIX)], file, body


def wrapped(check: Checker, key: str, body: object) -> bool:
    """Whether ``body`` is a whole ``[domains."D"]`` table (refused, with an error)."""
    if not isinstance(body, dict) or "domains" not in body:
        return False
    inner = body["domains"]
    named = sorted(inner) if isinstance(inner, dict) else []
    if named and named != [key]:
        check.error(
            "domains",
            f"the file is named for {show(key)} but names {', '.join(show(n) for n in named)}: "
            "a file's name is its domain",
        )
    else:
        check.error(
            "domains",
            f"write only the body of [domains.{show(key)}] here (its dkim, types, …), "
            "without the table header",
        )
    return True


def parse_domain(check: Checker, name: str, raw: object, path: str) -> DomainConfig:
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


def normalized(check: Checker, key: str, path: str, *, why: str = "") -> str | None:
    """``key`` as a normalized domain name, or None (with an error, ``why`` appended)."""
    try:
        return normalize_domain(key)
    except ValueError as exc:
        check.error(path, f"{show(key)} {exc}{why}")
        return None
