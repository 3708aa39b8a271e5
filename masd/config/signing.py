"""A peer entry's ``signing_secret_file`` and ``require_signature`` (docs/protocol.md §9.8)."""

from __future__ import annotations

import stat
from collections.abc import Mapping
from typing import Any, Final

from masd.config.checker import Checker
from masd.config.model import Signing
from masd.config.names import join, show
from masd.core import signing

#: The keys every peer entry (endpoint, master, webhook) may add.
SIGNING_KEYS: Final = frozenset({"signing_secret_file", "require_signature"})


def parse_signing(check: Checker, table: Mapping[str, Any], path: str) -> Signing:
    """The entry's signing secrets (each line of the file) and ``require_signature``."""
    required = check.get(table, path, "require_signature", bool, False)
    if "signing_secret_file" not in table:
        if required:
            check.error(
                join(path, "require_signature"),
                "true, but no signing_secret_file says which secrets sign this peer's requests",
            )
        return Signing(required=required)
    name = check.get(table, path, "signing_secret_file", str, "")
    where = join(path, "signing_secret_file")
    if isinstance(table["signing_secret_file"], str):
        return Signing(keys=_read_keys(check, where, name), required=required)
    return Signing(required=required)


def _read_keys(check: Checker, where: str, name: str) -> tuple[bytes, ...]:
    if not name:
        check.error(where, '"" is not a file name')
        return ()
    file = check.resolve(name)
    try:
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):
            check.error(where, f"{show(str(file))} is not a regular file")
            return ()
        data = file.read_bytes()
    except OSError as exc:
        check.error(where, f"cannot read {show(str(file))}: {exc.strerror or exc}")
        return ()
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        check.error(where, f"{file} is readable by group or others (mode {mode:04o}); chmod 600 it")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        check.error(where, f"{show(str(file))} is not ASCII text")
        return ()
    keys: list[bytes] = []
    refused = False
    for number, line in enumerate(text.splitlines(), start=1):
        secret = line.strip()
        if not secret:
            continue
        try:
            keys.append(signing.parse_secret(secret))
        except ValueError as exc:
            refused = True
            # The secret itself is never shown: only the line and what is wrong.
            check.error(where, f"{file} line {number}: the secret {exc} (whsec_ + base64)")
    if not keys and not refused:
        check.error(where, f"{show(str(file))} holds no secret")
    return tuple(keys)
