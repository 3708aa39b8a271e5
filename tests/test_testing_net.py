"""masd.testing.net: ports for servers under test, picked where clients do not take them."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from masd.testing import net


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low = net._ephemeral_start()
    ports = net.free_ports(20)
    assert len(set(ports)) == 20
    for port in ports:
        assert 1024 <= port < low  # a client's source port is never one of these
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_picked() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", net.free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert taken not in net.free_ports(200)


def test_a_port_another_process_picked_a_moment_ago_is_not_picked() -> None:
    """A port is free from its pick until its server binds it: test processes side by side
    leave each other's recent picks alone (the file per port they share)."""
    script = "from masd.testing import net; print(*net.free_ports(300))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    theirs = {int(p) for p in out.split()}
    assert len(theirs) == 300
    assert not theirs & set(net.free_ports(300))


def test_an_old_pick_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    port = net.free_port()
    assert not net._reserve(port)  # just picked: held
    monkeypatch.setattr(net, "_HOLD", 0.0)
    assert net._reserve(port)
