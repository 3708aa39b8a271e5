"""packaging/masd.toml.example copied as an operator starts from it: with secrets of their own.

The shipped ``secrets-example/*.token`` are public placeholders that
check-config refuses; a copy gets a fresh secret (mode 0600) in each of those
files instead, so the copy reads as a configuration someone set up.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "packaging" / "masd.toml.example"
SHIPPED_SECRETS = ROOT / "packaging" / "secrets-example"
#: What check-config warns of the example's store, /var/lib/masd/masd.db, where the package
#: that creates /var/lib/masd is not installed (as on a build machine).
EXAMPLE_STORE = Path("/var/lib/masd/masd.db")
STORE_WARNING = (
    ""
    if EXAMPLE_STORE.parent.is_dir()
    else f"warning: server.database: {EXAMPLE_STORE}: its directory {EXAMPLE_STORE.parent} "
    "does not exist, so masd cannot create the store there (create it, owned by the user masd "
    "runs as)\n"
)


def copy_example(directory: Path, name: str = "masd.toml") -> Path:
    """``directory/name``: the example, beside ``secrets-example/`` with fresh secrets."""
    folder = directory / "secrets-example"
    folder.mkdir(parents=True, exist_ok=True)
    for shipped in sorted(SHIPPED_SECRETS.glob("*.token")):
        token = folder / shipped.name
        token.write_text(f"{shipped.stem}-{secrets.token_urlsafe(24)}\n")
        token.chmod(0o600)
    copy = directory / name
    shutil.copyfile(EXAMPLE, copy)
    return copy
