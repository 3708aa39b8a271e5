"""How ``masd reload`` and a running masd talk: a pid file and a reload status file.

``masd serve --pid-file FILE`` writes its pid to FILE and, after each reload
(``SIGHUP``), the outcome to the status file next to it (FILE with the suffix
``.reload``): a JSON object ``{"pid", "reloads", "ok", "lines"}``, replaced
atomically.  ``masd reload`` sends ``SIGHUP`` and waits for ``reloads`` to
grow, then prints ``lines``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from masd.core.errors import MasdError


@dataclass(frozen=True)
class ReloadOutcome:
    """One reload: applied (``ok``) or refused, with what to tell the operator."""

    ok: bool
    lines: tuple[str, ...]


def status_path(pid_file: Path) -> Path:
    return pid_file.with_suffix(".reload")


def write_pid(pid_file: Path) -> None:
    try:
        _replace(pid_file, f"{os.getpid()}\n")
    except OSError as exc:
        raise MasdError(f"--pid-file {pid_file}: cannot write: {exc.strerror or exc}") from None


def remove_pid(pid_file: Path) -> None:
    for path in (pid_file, status_path(pid_file)):
        path.unlink(missing_ok=True)


def write_status(pid_file: Path, reloads: int, outcome: ReloadOutcome) -> None:
    status = {"pid": os.getpid(), "reloads": reloads, "ok": outcome.ok, "lines": outcome.lines}
    _replace(status_path(pid_file), json.dumps(status) + "\n")


def read_status(pid_file: Path) -> tuple[int, ReloadOutcome | None]:
    """(reloads so far, the last outcome); (0, None) before the first reload."""
    try:
        status = json.loads(status_path(pid_file).read_text("utf-8"))
    except (OSError, ValueError):
        return 0, None
    if not isinstance(status, dict):
        return 0, None
    outcome = ReloadOutcome(status.get("ok") is True, tuple(map(str, status.get("lines", ()))))
    reloads = status.get("reloads")
    return (reloads if isinstance(reloads, int) else 0), outcome


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text, "utf-8")
    os.replace(temporary, path)
