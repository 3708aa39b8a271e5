"""App wiring details: systemd notifications never break a start or a stop."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from masd.app import sd_notify


def test_sd_notify_sends_to_the_socket_systemd_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sd_notify("READY=1") is True
        assert sock.recv(64) == b"READY=1"


def test_sd_notify_to_a_vanished_socket_is_a_warning_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sd_notify("STOPPING=1") is False
    assert "sd_notify STOPPING=1" in caplog.text


def test_sd_notify_without_systemd_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False
