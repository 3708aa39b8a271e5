"""Concurrent ranges of a large attachment cost masd little memory, uuencoded or base64
(docs/protocol.md §16.8, docs/performance.md).

A real masd holds a mail with a 12 MiB uuencoded attachment and one with a 12 MiB base64
one.  30 clients ask at once for ``Range: bytes=0-0`` of each; masd's peak resident memory
over its level before (``/proc/PID/status`` VmHWM, reset by ``clear_refs``) is printed for
both and bounded by twice the size of the mail: one copy of it while the attachment is
found, and the pieces read, never a copy per client (before, the uuencoded one was decoded
whole for every client: about 600 MiB on this machine).
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import secrets
from pathlib import Path

import httpx
from support.readers import ANN, Readers, attached, running
from test_messages_http import vm

from masd.testing.inbound import mx_trace

SIZE = 12 * 1024 * 1024
CLIENTS = 30


def uuencoded_mail(rcpt: str, data: bytes) -> bytes:
    """A mail with a text part and ``data`` as an x-uuencode attachment."""
    head = [*mx_trace("example.org"), ("From", ANN), ("To", rcpt), ("Subject", "uu")]
    head += [("Message-ID", f"<{secrets.token_hex(8)}@example.org>"), ("MIME-Version", "1.0")]
    head.append(("Content-Type", 'multipart/mixed; boundary="b"'))
    lines = [f"{name}: {value}".encode() for name, value in head]
    lines += [b"", b"--b", b"Content-Type: text/plain", b"", b"See the file.", b"--b"]
    lines += [b'Content-Type: application/octet-stream; name="big.bin"']
    lines += [b'Content-Disposition: attachment; filename="big.bin"']
    lines += [b"Content-Transfer-Encoding: x-uuencode", b"", b"begin 644 big.bin"]
    body = b"".join(binascii.b2a_uu(data[i : i + 45]) for i in range(0, len(data), 45))
    return b"\r\n".join(lines) + b"\r\n" + body.replace(b"\n", b"\r\n") + b"`\r\nend\r\n--b--\r\n"


async def _ranges(r: Readers, ref: str, data: bytes) -> int:
    """masd's peak memory over its level while ``CLIENTS`` ask for byte 0 at once."""
    pid = r.masd.proc.pid if r.masd.proc else 0
    path = f"/mas/v0.1/messages/{ref}/attachments/0"
    headers = {"Authorization": f"Bearer {r.setup.master_token}", "Range": "bytes=0-0"}
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=r.setup.http_url, limits=limits, timeout=120) as http:
        idle = vm(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from here
        got = await asyncio.gather(*(http.get(path, headers=headers) for _ in range(CLIENTS)))
        peak = vm(pid, "VmHWM")
    assert {(g.status_code, g.content) for g in got} == {(206, data[:1])}
    whole = await r.get(path, "crm")
    assert hashlib.sha256(whole.content).hexdigest() == hashlib.sha256(data).hexdigest()
    return peak - idle


def test_concurrent_ranges_of_a_uuencoded_attachment_stay_within_its_size(
    tmp_path: Path,
) -> None:
    data = hashlib.shake_256(b"uu").digest(SIZE)
    rcpt = "case@help.example"

    async def main() -> None:
        async with running(tmp_path, server="max_message_bytes = 41943040\n") as r:
            mails = {
                "x-uuencode": uuencoded_mail(rcpt, data),
                "base64": attached(rcpt, "b64", data, filename="big.bin", ctype="x/y"),
            }
            for name, mail in mails.items():
                event = (await r.intake(r.crm, rcpt, mail))["event"]
                assert [a["size"] for a in event["attachments"]] == [SIZE]
                rise = await _ranges(r, event["message_ref"], data)
                print(
                    f"\nmasd peak over idle, {CLIENTS} concurrent Range: bytes=0-0 of a "
                    f"{SIZE >> 20} MiB {name} attachment (the mail {len(mail) / 2**20:.1f} "
                    f"MiB): {rise / 2**20:.1f} MiB"
                )
                # One copy of the mail while the attachment is found, its pieces as read.
                assert rise < 2 * len(mail), name

    asyncio.run(main())
