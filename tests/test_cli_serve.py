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


def test_a_unix_socket_in_a_missing_directory_names_the_directory(tmp_path: Path) -> None:
    """Without systemd there is no /run/masd: the refusal says which directory, and what else
    would do."""
    setup = write_master_config(
        tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25, modes=("callback",)
    )
    missing = tmp_path / "run" / "masd"
    text = setup.config.read_text()
    setup.config.write_text(
        text.replace(f'lmtp = "127.0.0.1:{setup.lmtp_port}"', f'lmtp = "unix:{missing}/lmtp.sock"')
    )
    done = serve(setup.config)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"masd: lmtp-listen: cannot listen on unix:{missing}/lmtp.sock: "
        f"the directory {missing} does not exist"
    ), lines
    assert '"127.0.0.1:2424"' in lines[0]
