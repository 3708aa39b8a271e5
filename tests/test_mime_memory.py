"""A 20 MiB attachment over the real LMTP path: masd's resident memory stays bounded.

masd runs as its own process (``masd serve``); the mail goes in over LMTP and
is recorded (raw bytes and event) before the 250.  The process's resident
memory is read from /proc: idle (after one small mail, so every module is
loaded), its peak while reading the big mail (``VmHWM``, the high-water mark
the kernel keeps), and once the mail is recorded.  The peak above idle must
stay under three times the message, and the memory must come back near idle.
The figures are printed (``pytest -s``).  The event reader's and the DATA
reader's own shares are held apart (tracemalloc over ``build_event`` and
``read_data``).
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import sqlite3
import tracemalloc
from pathlib import Path

import pytest
from support.masd_process import DOMAIN, MasdProcess, write_secret

from masd.core.event import build_event
from masd.core.trust import TrustSettings
from masd.edges.lmtp_data import UNSTUFF_WINDOW, Data, read_data
from masd.edges.lmtp_session import LINE_LIMIT
from masd.testing import lmtpclient
from masd.testing.config import server_table, write_config
from masd.testing.inbound import mx_trace
from masd.testing.net import free_ports

MIB = 1024 * 1024
#: glibc's malloc raises its mmap threshold after each large free, so later
#: large buffers come from the heap and stay mapped once freed; pinned, every
#: buffer over 128 KiB is its own mapping, returned when freed, and resident
#: memory shows what masd holds rather than what the allocator keeps.
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def _mail(attachment: bytes) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in mx_trace("example.org", dmarc="pass"))
    body = base64.encodebytes(attachment).replace(b"\n", b"\r\n")
    return (
        head.encode()
        + b"From: Pat <pat@example.org>\r\nTo: ticket@help.example\r\nSubject: big\r\n"
        b"Message-ID: <big@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="b"\r\n\r\n--b\r\n'
        b"Content-Type: text/plain\r\n\r\nThe scan is attached.\r\n--b\r\n"
        b"Content-Type: application/pdf; name=scan.pdf\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\n" + body + b"--b--\r\n"
    )


def _config(directory: Path) -> tuple[Path, int]:
    lmtp_port, http_port, smtp_port = free_ports(3)
    server = server_table(
        lmtp_port=lmtp_port,
        http_port=http_port,
        smtp_port=smtp_port,
        max_message_bytes=64 * MIB,
    )
    ticket = {"role": "master", "modes": ["chat"]}
    doc = {"server": server, "domains": {DOMAIN: {"types": {"ticket": ticket}}}}
    config = write_config(directory, doc, {"admin": "admin-" + os.urandom(8).hex()})
    write_secret(directory / "secrets" / "admin.token", "admin-" + os.urandom(16).hex())
    return config, lmtp_port


def test_the_reader_holds_a_20_mib_attachment_once() -> None:
    """The event reader alone: parts are views of the message, decoded once."""
    big = _mail(random.Random(20).randbytes(20 * MIB))
    tracemalloc.start()
    try:
        build_event(
            big,
            mail_from="pat@example.org",
            rcpt_to=f"ticket@{DOMAIN}",
            received_at="2025-01-06T10:00:05Z",
            message_ref="m-1",
            trust=TrustSettings.of(["mx.help.example"]),
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"\nbuild_event: message {len(big) / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB allocated")
    # the decoded attachment (3/4 of the message) and little else
    assert peak <= len(big)


def test_the_data_reader_holds_the_data_and_the_message() -> None:
    """The LMTP edge's DATA reader alone: the data as read and the message, nothing more."""
    big = _mail(random.Random(20).randbytes(20 * MIB))
    data = (b"\r\n" + big).replace(b"\r\n.", b"\r\n..")[2:] + b".\r\n"

    async def main() -> tuple[Data, int]:
        reader = asyncio.StreamReader(limit=LINE_LIMIT)  # aiosmtpd's reader limit

        async def feed() -> None:
            with memoryview(data) as view:
                for at in range(0, len(data), 64 * 1024):
                    reader.feed_data(view[at : at + 64 * 1024])
                    await asyncio.sleep(0)

        tracemalloc.start()
        try:
            feeder = asyncio.ensure_future(feed())
            got = await read_data(reader, None)
            await feeder
            return got, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    got, peak = asyncio.run(main())
    print(f"\nread_data: message {len(big) / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB allocated")
    assert got.content == big
    # the data as read (a bytearray, with up to an eighth spare), the message,
    # and the windows unstuffing moves through
    assert peak <= 2 * len(big) + len(big) // 8 + 4 * UNSTUFF_WINDOW


@pytest.fixture(scope="module")
def big_delivery(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """One 20 MiB attachment over LMTP to ``masd serve``: its RSS figures and size."""
    tmp_path = tmp_path_factory.mktemp("big")
    attachment = random.Random(20).randbytes(20 * MIB)
    big = _mail(attachment)
    small = _mail(b"tiny")
    config, port = _config(tmp_path / "masd")

    async def main() -> dict[str, int]:
        masd = MasdProcess(config, tmp_path / "masd.log")
        masd.env.update(ALLOCATOR)
        async with masd:
            assert masd.proc is not None
            pid = masd.proc.pid
            target = ("127.0.0.1", port)
            sender, rcpt = "pat@example.org", [f"ticket@{DOMAIN}"]
            result = await lmtpclient.deliver(target, sender, rcpt, small, timeout=60)
            assert result.codes == (250,), result
            await asyncio.sleep(0.5)
            idle = _status(pid)
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            result = await lmtpclient.deliver(target, sender, rcpt, big, timeout=120)
            assert result.codes == (250,), result
            peak = _status(pid)
            await asyncio.sleep(1.0)
            after = _status(pid)
        return {"idle": idle["VmRSS"], "peak": peak["VmHWM"], "after": after["VmRSS"]}

    figures = asyncio.run(main())
    size = figures["size"] = len(big)
    above = figures["peak"] - figures["idle"]
    left = figures["after"] - figures["idle"]
    print(
        f"\nmessage {size / MIB:.1f} MiB; RSS idle {figures['idle'] / MIB:.1f} MiB, "
        f"peak {figures['peak'] / MIB:.1f} MiB ({above / size:.2f}x the message above idle), "
        f"after {figures['after'] / MIB:.1f} MiB ({left / MIB:+.1f} MiB)"
    )
    db = sqlite3.connect(tmp_path / "masd" / "masd.db")
    try:
        (stored,) = db.execute("SELECT raw FROM messages WHERE size = ?", (size,)).fetchone()
    finally:
        db.close()
    assert stored == big
    return figures


def test_a_20_mib_attachment_leaves_memory_near_idle(big_delivery: dict[str, int]) -> None:
    left = big_delivery["after"] - big_delivery["idle"]
    assert left <= big_delivery["size"] // 2


def test_a_20_mib_attachment_is_read_in_bounded_memory(big_delivery: dict[str, int]) -> None:
    """The whole path: the DATA reader's two copies, the event's parts, the row SQLite writes.

    ``raw`` ends the ``messages`` row, so the zeroblob the insert carries is
    not expanded and the blob write fills the row's pages in place.
    """
    size, idle = big_delivery["size"], big_delivery["idle"]
    peak, after = big_delivery["peak"], big_delivery["after"]
    print(
        f"\nbounded: idle {idle / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB, "
        f"after {after / MIB:.1f} MiB; peak above idle {(peak - idle) / size:.2f}x "
        f"the {size / MIB:.1f} MiB message (bound 3x)"
    )
    assert peak - idle <= 3 * size
