"""Two LMTP drivers: Postfix's ``smtp-source -L`` (throughput) and a client loop (latency).

smtp-source reports no latency, so the latency columns come from
:func:`latency_run`: ``sessions`` connections, each sending one message at a
time over its own connection (as ``smtp-source -d`` does), timing each
transaction from ``MAIL FROM`` to the reply after the final dot.  With
``pipelined``, and where the server offers ``PIPELINING``, it writes ``MAIL``,
``RCPT`` and ``DATA`` together and reads their replies after, as Postfix's
LMTP client does (RFC 2920); otherwise one command at a time.  Its
message looks like smtp-source's (From, To, Date, Message-Id, Subject, then
``size`` bytes in 80-byte lines), with a fresh Message-Id each time.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.common import BenchError

SENDER = "bench@example.org"
IO_TIMEOUT = 120.0


def smtp_source() -> str:
    path = shutil.which("smtp-source") or (
        "/usr/sbin/smtp-source" if os.path.exists("/usr/sbin/smtp-source") else None
    )
    if path is None:
        raise BenchError("smtp-source is missing (Debian package postfix)")
    return path


def source_run(port: int, sessions: int, count: int, rcpt: str, size: int, timeout: float) -> float:
    """``smtp-source -L -d``: ``count`` messages over ``sessions`` sessions; seconds taken.

    smtp-source stops at the first reply that is not 2xx, so a clean exit
    means every message got ``250``.
    """
    argv = [
        smtp_source(),
        "-L",
        "-d",
        "-s",
        str(sessions),
        "-m",
        str(count),
        "-l",
        str(size),
        "-f",
        SENDER,
        "-t",
        rcpt,
        "-S",
        "benchmark",
        "-M",
        "client.bench.example",
        f"127.0.0.1:{port}",
    ]
    began = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"smtp-source did not finish within {timeout:g} s") from exc
    took = time.monotonic() - began
    if out.returncode != 0:
        raise BenchError(
            f"smtp-source exited {out.returncode}: {(out.stderr or out.stdout)[-500:]}"
        )
    return took


@dataclass
class LatencyResult:
    sessions: int
    sent: int = 0
    accepted: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, accepted messages only
    accepted_at: dict[str, float] = field(default_factory=dict)  # Message-Id -> epoch of its 250
    replies: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0


#: The authserv-id masd trusts in the benchmark's configuration (bench/masd_setup.py).
AUTHSERV_ID = "mx.help.example"


def message_id(n: int, tag: str) -> str:
    return f"<{tag}.{n}@client.bench.example>"


def message(rcpt: str, n: int, size: int, tag: str, *, authenticated: bool = False) -> bytes:
    """smtp-source's message shape, dot-stuffed and terminated for DATA.

    ``authenticated``: as an MX that checked DMARC hands it on, from a sender
    of its own (``bench.<tag>.<n>@example.org``, so no sender reaches a send cap):
    a trusted ``Authentication-Results`` with ``dmarc=pass`` on top.
    """
    sender = f"bench.{tag}.{n}@example.org" if authenticated else SENDER
    results = (
        f"Authentication-Results: {AUTHSERV_ID}; dmarc=pass header.from=example.org\r\n"
        if authenticated
        else ""
    )
    head = (
        f"{results}From: <{sender}>\r\nTo: <{rcpt}>\r\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
        f"Message-Id: {message_id(n, tag)}\r\nSubject: benchmark\r\n\r\n"
    )
    lines, left = [], size
    for i in itertools.count(1):
        if left <= 0:
            break
        line = (str(i) + "X" * 78)[: max(1, min(78, left - 2))]
        lines.append(line)
        left -= len(line) + 2
    return (head + "\r\n".join(lines) + "\r\n.\r\n").encode()


class _Session:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def reply(self) -> str:
        lines = []
        async with asyncio.timeout(IO_TIMEOUT):
            while True:
                line = await self.reader.readline()
                if not line:
                    raise BenchError("LMTP server closed the connection")
                lines.append(line.decode("utf-8", "replace").rstrip("\r\n"))
                if len(line) < 4 or line[3:4] != b"-":
                    return "\n".join(lines)

    async def command(self, text: bytes) -> str:
        self.writer.write(text)
        return await self.reply()

    async def envelope(self, mail: str, rcpt: str, together: bool) -> str:
        """MAIL, RCPT and DATA (written at once when ``together``): the first code that
        is not the one wanted, else ``354``."""
        lines = [f"{mail}\r\n".encode(), f"{rcpt}\r\n".encode(), b"DATA\r\n"]
        if together:
            self.writer.write(b"".join(lines))
            codes = [(await self.reply())[:3] for _ in lines]
        else:
            codes = []
            for line, want in zip(lines, ("250", "250", "354"), strict=True):
                codes.append((await self.command(line))[:3])
                if codes[-1] != want:
                    break
        for code, want in zip(codes, ("250", "250", "354"), strict=False):
            if code != want:
                return code
        return "354"


async def latency_run(
    port: int,
    sessions: int,
    count: int,
    rcpt: Callable[[int], str],
    *,
    size: int = 2048,
    tag: str = "lat",
    authenticated: bool = False,
    pipelined: bool = False,
) -> LatencyResult:
    """``count`` messages over ``sessions`` connections; latency of each transaction."""
    result = LatencyResult(sessions)
    numbers = iter(range(count))

    async def session() -> None:
        async with asyncio.timeout(IO_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        s = _Session(reader, writer)
        try:
            await s.reply()
            offered = await s.command(b"LHLO client.bench.example\r\n")
            together = pipelined and "PIPELINING" in offered.upper()
            for n in numbers:
                to = rcpt(n)
                data = message(to, n, size, tag, authenticated=authenticated)
                began = time.perf_counter()
                result.sent += 1
                code = await s.envelope(f"MAIL FROM:<{SENDER}>", f"RCPT TO:<{to}>", together)
                if code == "354":
                    code = (await s.command(data))[:3]
                else:
                    await s.command(b"RSET\r\n")
                result.replies[code] += 1
                if code == "250":
                    result.accepted += 1
                    result.latencies.append(time.perf_counter() - began)
                    result.accepted_at[message_id(n, tag)] = time.time()
            await s.command(b"QUIT\r\n")
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    result.seconds = time.perf_counter() - began
    return result
