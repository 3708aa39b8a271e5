"""The checker: walks the parsed TOML, collecting every error and warning in file order.

No check stops the walk: a bad value gets an error naming its key path and a
stand-in value, so the keys after it are still checked and the operator sees
every error of the file at once.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from masd.config.model import Listen
from masd.config.names import did_you_mean, join, show
from masd.config.placeholders import MAKE_ONE, PLACEHOLDER_SECRETS
from masd.config.values import parse_duration, parse_listen, url_problem
from masd.core.errors import ConfigError

T = TypeVar("T")

_TYPE_NAMES: Final[dict[type, str]] = {
    str: "a string",
    int: "an integer",
    bool: "a boolean (true or false)",
    list: "an array",
    dict: "a table",
}


@dataclass
class _Secret:
    path: str
    kind: str  # "admin", "mode", "master" or "webhook"
    url: str  # "" for the admin secret, which belongs to no peer


class Checker:
    """Collects errors and warnings while the file is walked, in file order."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.errors: list[ConfigError] = []
        self.warnings: list[str] = []
        self.secrets: dict[str, _Secret] = {}
        #: The file being walked when it is not the main one (a domains_dir file).
        self.file = ""

    def error(self, path: str, detail: str) -> None:
        self.errors.append(ConfigError(detail, path=path, file=self.file))

    def warn(self, path: str, text: str) -> None:
        where = ": ".join(part for part in (self.file, path) if part)
        self.warnings.append(f"{where}: {text}" if where else text)

    # ---- tables and typed keys

    def table(
        self,
        value: object,
        path: str,
        allowed: frozenset[str],
        *,
        suggest: Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """``value`` as a table whose unknown keys are errors; {} when it is not a table.

        An unknown key close to a known one gets the known one suggested (from
        ``suggest`` when given: the keys that make sense here, else ``allowed``).
        """
        if not isinstance(value, dict):
            self.error(path, f"{show(value)} is not a table")
            return {}
        for key in value:
            if key not in allowed:
                hint = did_you_mean(key, (allowed if suggest is None else suggest))
                self.error(join(path, key), f"unknown key{hint}")
        return value

    def get(self, table: Mapping[str, Any], path: str, key: str, kind: type[T], default: T) -> T:
        """``table[key]`` when it is a ``kind``, else ``default`` (with an error if present)."""
        if key not in table:
            return default
        value = table[key]
        if not _has_type(value, kind):
            self.error(join(path, key), f"{show(value)} is not {_TYPE_NAMES[kind]}")
            return default
        return value  # type: ignore[no-any-return]

    def require(
        self, table: Mapping[str, Any], path: str, key: str, kind: type[T], fallback: T
    ) -> T:
        if key not in table:
            self.error(join(path, key), f"missing: {_TYPE_NAMES[kind]} is required here")
            return fallback
        return self.get(table, path, key, kind, fallback)

    def strings(
        self, table: Mapping[str, Any], path: str, key: str, check: Callable[[str, str], str | None]
    ) -> tuple[str, ...]:
        """An array of strings, each passed through ``check(path, value) -> kept or None``."""
        items = self.get(table, path, key, list, [])
        kept: list[str] = []
        for index, item in enumerate(items):
            item_path = f"{join(path, key)}[{index}]"
            if not isinstance(item, str):
                self.error(item_path, f"{show(item)} is not a string")
                continue
            value = check(item_path, item)
            if value is None:
                continue
            if value in kept:
                self.error(item_path, f"{show(item)} is listed twice")
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
            self.error(path, f"{show(text)} is not longer than zero")
        return seconds

    def require_url(self, table: Mapping[str, Any], path: str, key: str) -> str:
        """A required http(s) URL; "" (with an error) when missing, mistyped or bad."""
        url = self.require(table, path, key, str, "")
        if isinstance(table.get(key), str):
            return self.url(join(path, key), url)
        return url

    def url(self, path: str, text: str) -> str:
        problem = url_problem(text)
        if problem is not None:
            self.error(path, f"{show(text)} {problem}")
        return text

    def listen(self, path: str, text: str, *, min_port: int = 0) -> Listen | None:
        try:
            return parse_listen(text, base_dir=self.base_dir, min_port=min_port)
        except ValueError as exc:
            self.error(path, f"{show(text)} {exc}")
            return None

    def resolve(self, text: str) -> Path:
        path = Path(text).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def read_file(self, path: str, text: str, *, private: bool = False) -> bytes | None:
        """The bytes of a secret file; errors for missing or non-regular files.

        A file readable by group or others (``mode & 0o077``) is a warning, or an error
        when ``private`` (as libpq refuses such a ``.pgpass``).
        """
        if not text:
            self.error(path, '"" is not a file name')
            return None
        file = self.resolve(text)
        try:
            info = file.stat()
            if not stat.S_ISREG(info.st_mode):
                self.error(path, f"{show(str(file))} is not a regular file")
                return None
            data = file.read_bytes()
        except OSError as exc:
            self.error(path, f"cannot read {show(str(file))}: {exc.strerror or exc}")
            return None
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            why = f"{file} is readable by group or others (mode {mode:04o}); chmod 600 it"
            if private:
                self.error(path, why)
                return None
            self.warn(path, why)
        return data

    def secret(self, path: str, text: str, *, kind: str, url: str = "") -> str:
        """Read a token file; register the secret as the identity of a ``kind`` peer at ``url``."""
        data = self.read_file(path, text)
        if data is None:
            return ""
        token = self._token(path, text, data)
        if not token:
            return ""
        if token in PLACEHOLDER_SECRETS:
            self.error(
                path,
                f"{self.resolve(text)} holds a placeholder secret shipped with masd "
                f"(secrets-example), which anyone can read: make your own ({MAKE_ONE})",
            )
            return ""
        # docs/protocol.md §9: "The sender's identity is the peer whose secret matched,
        # never a field of the message."  One secret must therefore name one
        # peer: two peers of different kinds or at different URLs (or a peer
        # and the admin) sharing a secret could act as each other.  The same
        # service (same kind, same URL) may serve several types with one secret.
        first = self.secrets.get(token)
        if first is None:
            where = f"{self.file}: {path}" if self.file else path
            self.secrets[token] = _Secret(where, kind, url)
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

    def _token(self, path: str, text: str, data: bytes) -> str:
        """The one secret a token file holds, or "" (with an error)."""
        try:
            token = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            self.error(path, f"{show(str(self.resolve(text)))} is not UTF-8 text")
            return ""
        if not token:
            self.error(path, f"{show(str(self.resolve(text)))} is empty")
            return ""
        if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
            self.error(
                path,
                f"{show(str(self.resolve(text)))} must hold one secret of printable ASCII "
                "without spaces (it is sent in an Authorization header)",
            )
            return ""
        return token


def _has_type(value: object, kind: type) -> bool:
    if kind is int and isinstance(value, bool):  # TOML true is not an integer
        return False
    return isinstance(value, kind)
