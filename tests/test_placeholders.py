"""The public placeholder secrets of packaging/secrets-example/ are refused wherever they appear."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.example import SHIPPED_SECRETS, copy_example

from masd.config.placeholders import PLACEHOLDER_SECRETS


def test_the_refused_placeholders_are_the_shipped_ones() -> None:
    shipped = {path.read_text().strip() for path in SHIPPED_SECRETS.glob("*.token")}
    assert len(shipped) == 4
    assert shipped == PLACEHOLDER_SECRETS


def test_masd_serve_refuses_a_placeholder_in_a_domain_file(tmp_path: Path) -> None:
    """Not only check-config: serve loads the same way, and a domain file's secret is named
    with that file."""
    config = copy_example(tmp_path)
    folder = tmp_path / "domains.d"
    folder.mkdir()
    placeholder = SHIPPED_SECRETS / "callback.token"
    domain_file = folder / "shop.example.toml"
    domain_file.write_text(
        '[types.order]\nrole = "master"\nmodes = ["callback"]\n'
        '[types.order.endpoints.callback]\nurl = "http://127.0.0.1:9001/mas"\n'
        f'token_file = "{placeholder}"\ndeadline = "2h"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "masd", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[:2] == [
        f'{domain_file}: domains."shop.example".types.order.endpoints.callback.token_file: '
        f"{placeholder} holds a placeholder secret shipped with masd (secrets-example), which "
        "anyone can read: make your own (head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE)",
        f"masd: 1 error in {config}",
    ]
