"""masd as a child with every listener on loopback, small caps and known secrets,
for the hostile-load and hostile-log tests; and the raw clients they use."""

from __future__ import annotations

import asyncio
import re
import secrets
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from masd.testing.config import AUTHSERV_ID, DOMAIN, write_config
from masd.testing.net import free_ports
from masd.testing.process import MasdProcess

#: masd's text line: the standard library's asctime, a level, a logger name.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ ")
#: The first line of the log file, written by the rig before masd starts.
RIG_LINE = "==== "
#: Sets the child's RLIMIT_NOFILE, then becomes ``argv[3:]`` (same process id).
_WITH_LIMIT = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


@dataclass(frozen=True)
class Hostile:
    """A written configuration: ports, secrets, the caps."""

    config: Path
    ports: dict[str, int]  # lmtp, http, policy, milter
    admin: str
    callback: str
    cap: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"


def write_hostile_config(
    directory: Path, *, cap: int, endpoint_url: str, smtp_port: int, **server: Any
) -> Hostile:
    """Type ``ticket`` (master, mode ``callback`` at ``endpoint_url``), all four
    listeners on loopback, each capped at ``cap``; ``server`` keys added."""
    names = ("lmtp", "http", "policy", "milter")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    tokens = {
        "admin": "admin-" + secrets.token_hex(16),
        "callback": "callback-" + secrets.token_hex(16),
    }
    table: dict[str, Any] = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    table |= {
        "database": "masd.db",
        "smtp_relay": f"127.0.0.1:{smtp_port}",
        "trusted_authserv_ids": [AUTHSERV_ID],
        "admin_token_file": "secrets/admin.token",
        "max_lmtp_sessions": cap,
        "max_http_connections": cap,
        "max_policy_connections": cap,
        "max_milter_connections": cap,
        **server,
    }
    ticket = {
        "role": "master",
        "modes": ["callback"],
        "endpoints": {
            "callback": {
                "url": endpoint_url,
                "token_file": "secrets/callback.token",
                "deadline": "1h",
                "fields": ["phone"],
            }
        },
    }
    doc = {"server": table, "domains": {DOMAIN: {"types": {"ticket": ticket}}}}
    path = write_config(directory, doc, tokens)
    return Hostile(path, ports, tokens["admin"], tokens["callback"], cap)


def limited(masd: MasdProcess, soft: int, hard: int) -> MasdProcess:
    """``masd``, started with RLIMIT_NOFILE ``(soft, hard)``."""
    masd.argv = [sys.executable, "-c", _WITH_LIMIT, str(soft), str(hard), *masd.argv]
    return masd


def open_files(pid: int) -> tuple[int, int]:
    """The soft and hard limit on open files of process ``pid`` (/proc/PID/limits)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files limit for {pid}")


def milter_frame(command: bytes, *strings: bytes) -> bytes:
    data = command + b"".join(s + b"\0" for s in strings)
    return struct.pack("!L", len(data)) + data


MILTER_NEGOTIATE = struct.pack("!L", 13) + b"O" + struct.pack("!LLL", 6, 0x1FF, 0x1FFFFF)


async def milter_read(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    (size,) = struct.unpack("!L", await reader.readexactly(4))
    data = await reader.readexactly(size)
    return data[:1], data[1:]


def policy_request(recipient: str, **attrs: str) -> bytes:
    lines = {
        "request": "smtpd_access_policy",
        "protocol_state": "RCPT",
        "recipient": recipient,
        **attrs,
    }
    return (
        "".join(f"{k}={v}\n" for k, v in lines.items()).encode("utf-8", "surrogateescape") + b"\n"
    )


def masd_lines(log: str) -> list[str]:
    """The lines masd wrote (the rig's own first lines left out)."""
    return [line for line in log.splitlines() if not line.startswith(RIG_LINE)]
