"""Loopback ports: ones that are free, and whether one is listening yet."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from pathlib import Path
from typing import Final

__all__ = ["free_port", "free_ports", "listening"]


#: Ports are picked below the kernel's ephemeral range (its first port is here), so
#: that a client's connection elsewhere cannot take one between the pick and the bind.
_EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN: Final = 10_000
_TRIES: Final = 50
#: Its own generator, seeded by the system: hypothesis seeds the global ``random`` alike in
#: every process, so test processes running side by side would pick the same ports.
_PICK: Final = random.SystemRandom()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range."""
    low = _ephemeral_start()
    for _ in range(_TRIES):
        port = _PICK.randrange(max(1024, low - _SPAN), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # every pick taken: one the kernel chooses
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    try:
        return max(1025, int(_EPHEMERAL_RANGE.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


async def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP connection to ``host:port`` is accepted (it is closed at once)."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
