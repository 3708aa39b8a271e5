"""Loopback ports: ones that are free, and whether one is listening yet."""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["free_port", "free_ports", "listening"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
