"""Loopback ports: ones that are free, and whether one is listening yet."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import tempfile
import time
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
#: A port picked by any process on this machine is left to it this long: test processes
#: running side by side pick from one range, and a port stays free from its pick until its
#: server binds it (a Postfix or a PostgreSQL started in between can take seconds).
_HOLD: Final = 120.0
_RESERVED: Final = Path(tempfile.gettempdir()) / "masd-test-ports"


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
        if _reserve(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # every pick taken: one the kernel chooses
        return int(sock.getsockname()[1])


def _reserve(port: int) -> bool:
    """Take ``port`` unless a process on this machine (this one included) picked it less
    than :data:`_HOLD` seconds ago: a file per port in :data:`_RESERVED`, its time the pick's."""
    path = _RESERVED / str(port)
    now = time.time()
    try:
        _RESERVED.mkdir(mode=0o1777, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        try:
            if now - path.stat().st_mtime < _HOLD:
                return False
            os.utime(path, (now, now))  # an old pick: this process's now
        except OSError:
            return False
        return True
    except OSError:
        return True  # no shared directory to mark it in: the bind check alone
    os.close(fd)
    return True


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
