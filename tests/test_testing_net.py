"""masd.testing.net: ports for servers under test, picked where clients do not take them."""

from __future__ import annotations

import socket

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
