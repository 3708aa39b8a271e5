"""Reading the files: TOML syntax, the top level, each ``[domains."D"]`` table and
each domain file of ``server.domains_dir``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from masd.config.checker import Checker
from masd.config.domains import domain_files, normalized, parse_domain, read_toml, wrapped
from masd.config.model import Config, ConfigErrors, DomainConfig
from masd.config.names import join, show
from masd.config.server import parse_server

_TOP_KEYS: Final = frozenset({"server", "domains"})


def load_config(path: str | Path) -> Config:
    """Read, parse and validate the file at ``path``, its domain files and the secrets
    they name."""
    file = Path(path)
    data = read_toml(file, str(path))
    base_dir = Path(os.path.abspath(file)).parent  # lexical: a symlinked file keeps its directory
    return parse_config(data, base_dir=base_dir, source=str(path))


def pid_file_of(path: str | Path) -> Path | None:
    """``server.pid_file`` of the file at ``path`` (resolved as :func:`load_config` does),
    read without the rest of the configuration: ``masd reload`` finds the running masd by
    it, and a new configuration with errors is for that masd to refuse, by name.
    :class:`ConfigErrors` when the file is no TOML or the key is not a file name."""
    file = Path(path)
    data = read_toml(file, str(path))
    check = Checker(Path(os.path.abspath(file)).parent)
    server = data.get("server")
    found = None
    if isinstance(server, dict) and "pid_file" in server:
        text = check.get(server, "server", "pid_file", str, "")
        if text:
            found = check.resolve(text)
        else:
            check.error(
                join("server", "pid_file"), f"{show(server['pid_file'])} is not a file name"
            )
    if check.errors:
        raise ConfigErrors(check.errors, source=str(path))
    return found


def parse_config(data: Mapping[str, Any], *, base_dir: Path, source: str = "<config>") -> Config:
    """Validate parsed TOML ``data``; relative paths are relative to ``base_dir``.

    Token and key files are read here, and the domain files of
    ``server.domains_dir`` (by default ``domains.d`` in ``base_dir``).
    Raises :class:`ConfigErrors` with every error found.
    """
    check = Checker(base_dir)
    top = check.table(dict(data), "", _TOP_KEYS)
    server = parse_server(check, check.get(top, "", "server", dict, {}))
    domains: dict[str, DomainConfig] = {}
    written: dict[str, str] = {}  # A-label name -> where it was defined, as shown
    for key, raw in check.get(top, "", "domains", dict, {}).items():
        path = join("domains", key)
        name = normalized(check, key, path)
        if name is None:
            continue
        if name in written:
            check.error(path, f"{show(key)} is the same domain as {written[name]}")
            continue
        written[name] = show(key)
        domains[name] = parse_domain(check, name, raw, path)
    files = 0
    for key, file, body in domain_files(check, server):
        files += 1
        check.file, check.base_dir = str(file), file.parent
        path = join("domains", key)
        name = normalized(check, key, path, why=f"; the file {file.name} is named for its domain")
        if name is not None and name in written:
            check.error(path, f"{show(key)} is defined twice: here and in {written[name]}")
        elif name is not None and not wrapped(check, key, body):
            written[name] = str(file)
            domains[name] = parse_domain(check, name, body, path)
        check.file, check.base_dir = "", base_dir
    if not files and not top.get("domains"):
        state = "empty" if "domains" in top else "missing"
        check.error("domains", f"{state}: at least one domain is required")
    if check.errors:
        raise ConfigErrors(check.errors, source=source)
    return Config(
        server=server,
        domains=MappingProxyType(domains),
        source=source,
        warnings=tuple(check.warnings),
    )
