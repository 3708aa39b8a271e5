"""A body masd cannot complete closes its connection (docs/protocol.md §16.8, RFC 9112 §6.3).

A real masd serves a 12 MiB mail's raw bytes and its attachment to a raw socket client that
reads slowly (a small receive buffer, then nothing until the case is erased) and has already
sent a second request on the same keep-alive connection.  The case is erased mid-stream: the
client then reads fewer bytes than the announced Content-Length, then the end of the
connection; the second request is never answered on it (before, masd stopped short and kept
the connection, and the next answer was read as part of the body).
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

from support.masd_process import WAIT
from support.readers import Readers, attached, running

SIZE = 9 * 1024 * 1024  # a 12 MiB mail once base64
#: What the client's socket holds unread: far less than the body.
RECEIVE_BUFFER = 32 * 1024


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=RECEIVE_BUFFER)


async def _cut_short(r: Readers, path: str, case_key: str) -> tuple[int, int, bytes]:
    """GET ``path`` then ``/healthz`` on one connection, erase ``case_key`` after the first
    bytes; (the Content-Length announced, the body bytes read, what followed them)."""
    reader, writer = await _connect(r.setup.http_port)
    secret = r.setup.admin_token
    head = f"GET {path} HTTP/1.1\r\nHost: masd\r\nAuthorization: Bearer {secret}\r\n\r\n"
    writer.write(head.encode() + b"GET /healthz HTTP/1.1\r\nHost: masd\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    fields = dict(line.split(b":", 1) for line in answer.split(b"\r\n")[1:] if b":" in line)
    length = int(fields[b"Content-Length"])
    got = len(await asyncio.wait_for(reader.readexactly(64 * 1024), WAIT))
    erased = await r.http.post(
        f"/mas/v0.1/cases/{case_key}/erase",
        headers={"Authorization": f"Bearer {r.setup.admin_token}"},
    )
    assert erased.status_code == 200, erased.text
    tail = b""
    while got < length:
        piece = await asyncio.wait_for(reader.read(256 * 1024), WAIT)
        if not piece:
            break  # the end of the connection
        got += len(piece)
        if got > length or b"HTTP/1.1 " in piece:
            tail = piece[-200:]  # the next answer, read as though it were the body
            break
        await asyncio.sleep(0.001)  # a slow reader
    writer.close()
    return length, min(got, length), tail


async def _case_with_mail(r: Readers, data: bytes, resource: str) -> tuple[str, dict[str, object]]:
    intake = await r.intake(r.crm, "case@help.example", data)
    await r.assign(r.setup.master_token, intake["intake_ref"], resource)
    return f"case={resource}@help.example", intake["event"]


def test_an_erase_mid_download_ends_the_connection_after_fewer_bytes(tmp_path: Path) -> None:
    blob = hashlib.shake_256(b"framing").digest(SIZE)

    async def main() -> None:
        async with running(tmp_path, server="max_message_bytes = 41943040\n") as r:
            for tail, resource in (("/raw", "c-raw"), ("/attachments/0", "c-file")):
                data = attached("case@help.example", resource, blob, filename="big.bin")
                key, event = await _case_with_mail(r, data, resource)
                path = f"/mas/v0.1/messages/{event['message_ref']}{tail}"
                length, got, after = await _cut_short(r, path, key)
                print(f"{tail}: {got} of {length} bytes, then the end of the connection")
                assert not after, f"the connection was reused: {after!r}"
                assert 64 * 1024 <= got < length
            assert "bytes cut short" in r.masd.log()

    asyncio.run(main())
