"""``domains.D.dkim``: one key table, or an array of them signing together."""

from __future__ import annotations

import re
from typing import Final

from masd.config.checker import Checker as _Checker
from masd.config.model import Dkim
from masd.config.names import join as _join
from masd.config.names import show as _show

_DKIM_KEYS: Final = frozenset({"selector", "key_file"})

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
