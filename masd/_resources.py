"""Where masd finds its conformance data (status table, JSON schemas).

The data lives once, in the repository's ``conformance/`` folder; a wheel
carries a copy as ``masd/_conformance`` (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent / "_conformance"
_SOURCE = Path(__file__).resolve().parent.parent / "conformance"


def conformance_dir() -> Path:
    """The folder holding ``transitions.json`` and ``schema/``."""
    return _PACKAGED if _PACKAGED.is_dir() else _SOURCE


def conformance_file(name: str) -> Path:
    return conformance_dir() / name
