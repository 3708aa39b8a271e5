"""``masd serve`` as an operator meets it: a listener that cannot start is one clear line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.masd_process import write_master_config


def serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("masd")), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("listener", ["lmtp", "http"])
def test_a_port_in_use_prints_the_error_and_nothing_else(tmp_path: Path, listener: str) -> None:
    setup = write_master_config(
        tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25, modes=("callback",)
    )
    port = setup.lmtp_port if listener == "lmtp" else setup.http_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = serve(setup.config)
    assert done.returncode == 1
    assert done.stdout == ""
    # One line (the wording is the listener's own), and no asyncio noise after it.
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("masd: "), line
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line
