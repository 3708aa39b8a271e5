"""Files a test rig writes for masd: secret files (mode 0600) and TOML configurations."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["to_toml", "write_secret", "write_secrets"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def write_secret(path: Path, value: str) -> None:
    """``value`` and a newline in ``path``, created with mode 0600 (and its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")


def write_secrets(folder: Path, tokens: Mapping[str, str]) -> None:
    """``folder/<name>.token`` for each name and value (the folder mode 0700)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, value in tokens.items():
        write_secret(folder / f"{name}.token", value)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _is_table(value: Any) -> bool:
    """A dict (a table) or a non-empty list of dicts (an array of tables)."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def to_toml(doc: Mapping[str, Any], prefix: str = "") -> str:
    """A TOML document for a dict of dicts, strings, numbers, booleans and lists."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in doc.items():
        name = f"{prefix}.{_key(key)}" if prefix else _key(key)
        if _is_table(value):
            tables.append((name, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for name, value in tables:
        if isinstance(value, list):
            for item in value:
                text += f"\n[[{name}]]\n" + to_toml(item, name)
        else:
            body = to_toml(value, name)
            has_scalars = any(not _is_table(v) for v in value.values())
            text += (f"\n[{name}]\n" if has_scalars or not value else "") + body
    return text
