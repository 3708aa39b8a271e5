"""Hostile load (docs/operations.md §12): every listener held at its cap by idle
connections and flooded beyond it, while mail is delivered and statuses accepted.

masd runs as a child whose RLIMIT_NOFILE is exactly what its caps need (four
caps of :data:`CAP` and the margin): the flood opens more connections than
that, so without the caps masd would run out of descriptors.  Then the
descriptors do run out (the soft limit lowered under masd's feet with
``prlimit``) and the log must say so once, not once per failed accept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from support.hostile import (
    MILTER_NEGOTIATE,
    Hostile,
    limited,
    masd_lines,
    milter_frame,
    milter_read,
    open_files,
    policy_request,
    write_hostile_config,
)
from support.masd_process import WAIT, MasdProcess, mx_mail

from masd.edges.descriptors import MARGIN
from masd.testing.lmtpclient import LmtpConnection, deliver
from masd.testing.peers import FakePeer, Recorded, SmtpSink

pytestmark = pytest.mark.fault

CAP = 20
#: Connections beyond the cap opened at once on each listener.
FLOOD = 80
MAILS = 12
RCPT = "ticket!callback@help.example"
#: The first bytes a connection over each cap gets (the milter: none, just the close).
REFUSALS = {
    "lmtp": b"421 4.3.2",
    "http": b"HTTP/1.1 503",
    "policy": b"action=DEFER_IF_PERMIT 4.3.2",
    "milter": b"",
}


async def _hold(h: Hostile, name: str) -> asyncio.StreamWriter:
    """One idle connection that masd admitted (LMTP greeted it, HTTP answered it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports[name])
    if name == "lmtp":
        assert (await reader.readline()).startswith(b"220 ")
    elif name == "http":  # an unauthenticated request, then the connection kept alive
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: masd\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    return writer


async def _flooded(h: Hostile, name: str) -> bytes:
    """What a connection over the cap gets before masd closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports[name])
    try:
        async with asyncio.timeout(WAIT):
            return await reader.read(64)
    finally:
        writer.close()


class Legit:
    """The clients masd must keep serving: one connection to each listener,
    opened before the flood."""

    def __init__(self, h: Hostile) -> None:
        self.h = h
        self.http = httpx.AsyncClient(
            base_url=h.http, limits=httpx.Limits(max_connections=1), timeout=WAIT
        )

    async def open(self) -> None:
        h = self.h
        self.lmtp = await LmtpConnection.open(("127.0.0.1", h.ports["lmtp"]))
        self.policy = await asyncio.open_connection("127.0.0.1", h.ports["policy"])
        self.milter = await asyncio.open_connection("127.0.0.1", h.ports["milter"])
        self.milter[1].write(MILTER_NEGOTIATE)
        assert (await milter_read(self.milter[0]))[0] == b"O"
        assert (await self.http.get("/healthz")).status_code == 200

    async def policy_says(self, recipient: str) -> bytes:
        reader, writer = self.policy
        writer.write(policy_request(recipient))
        return await reader.readuntil(b"\n\n")

    async def milter_says(self, recipient: str) -> bytes:
        reader, writer = self.milter
        writer.write(milter_frame(b"M", b"from@example.org"))
        assert (await milter_read(reader))[0] == b"c"
        writer.write(milter_frame(b"R", f"<{recipient}>".encode()))
        return (await milter_read(reader))[0]

    async def post_status(self, request: Recorded) -> int:
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": secrets.token_hex(16),
            "case": request.json["case"],
            "handoff_id": request.json["handoff_id"],
            "seq": 1,
            "status": "running",
        }
        answer = await self.http.post(
            "/mas/v0.1/messages",
            json=message,
            headers={"Authorization": f"Bearer {self.h.callback}"},
        )
        return answer.status_code

    async def close(self) -> None:
        await self.lmtp.close()
        for _, writer in (self.policy, self.milter):
            writer.close()
        await self.http.aclose()


@contextlib.asynccontextmanager
async def hostile_masd(tmp_path: Path) -> AsyncIterator[tuple[Hostile, MasdProcess, FakePeer]]:
    need = 4 * CAP + MARGIN
    async with FakePeer() as peer, SmtpSink() as sink:
        h = write_hostile_config(
            tmp_path, cap=CAP, endpoint_url=peer.url + "mas", smtp_port=sink.port
        )
        masd = limited(MasdProcess(h.config, tmp_path / "masd.log"), need, need)
        async with masd:
            assert masd.proc is not None
            assert open_files(masd.proc.pid) == (need, need)
            yield h, masd, peer


def test_listeners_held_at_their_caps_still_deliver_and_answer(tmp_path: Path) -> None:
    async def main() -> None:
        async with hostile_masd(tmp_path) as (h, masd, peer):
            legit = Legit(h)
            await legit.open()
            held = [await _hold(h, name) for name in h.ports for _ in range(CAP - 1)]
            floods = {
                name: await asyncio.gather(*(_flooded(h, name) for _ in range(FLOOD)))
                for name in h.ports
            }
            for name, answers in floods.items():  # each closed by masd, after its refusal
                assert all(a.startswith(REFUSALS[name]) for a in answers), (name, answers[:3])
                assert name != "milter" or set(answers) == {b""}, answers[:3]
            delivered = statuses = 0
            for n in range(MAILS):
                _, mail = mx_mail(f"client{n}@example.org", RCPT, subject=f"Call {n}")
                result = await legit.lmtp.send(f"client{n}@example.org", [RCPT], mail)
                assert result.codes == (250,), result
                delivered += 1
                await peer.wait_for(n + 1, WAIT)
                assert await legit.post_status(peer.requests[n]) == 200
                statuses += 1
                assert (await legit.http.get("/healthz")).status_code == 200
            assert (await legit.policy_says("nosuch@help.example")).startswith(b"action=REJECT")
            assert await legit.milter_says("ticket@help.example") == b"c"
            opened = len(held) + sum(len(a) for a in floods.values()) + 4
            print(
                f"\nhostile load: caps {CAP} x 4, RLIMIT_NOFILE {4 * CAP + MARGIN}; "
                f"{opened} connections opened ({len(held)} held idle, "
                f"{sum(len(a) for a in floods.values())} refused at the cap); "
                f"{delivered} mails delivered 250, {statuses} statuses accepted 200"
            )
            for writer in held:
                writer.close()
            await legit.close()
            lines = masd_lines(masd.log())
            print(f"log: {len(lines)} lines, {len(masd.log())} octets")
            assert not [line for line in lines if "Traceback" in line or "resource" in line]
            assert len(lines) < 12 * MAILS + 40, "\n".join(lines[-40:])

    asyncio.run(main())


def test_out_of_descriptors_is_logged_once_not_per_accept(tmp_path: Path) -> None:
    async def main() -> None:
        async with hostile_masd(tmp_path) as (h, masd, _):
            assert masd.proc is not None
            pid = masd.proc.pid
            soft, hard = open_files(pid)
            in_use = len(os.listdir(f"/proc/{pid}/fd"))
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use, hard))
            waiting = [
                await asyncio.open_connection("127.0.0.1", h.ports[name])
                for name in h.ports
                for _ in range(10)
            ]
            cpu = _cpu_seconds(pid)
            await asyncio.sleep(3)  # masd tries again and again, with growing pauses
            cpu = _cpu_seconds(pid) - cpu
            during = masd_lines(masd.log())
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
            # The connections that waited in the kernel's queue are served now.
            reader, _ = waiting[0]
            async with asyncio.timeout(WAIT):
                assert (await reader.readline()).startswith(b"220 ")
            for _, writer in waiting:
                writer.close()
            _, mail = mx_mail("ann@example.org", RCPT)
            result = await deliver(("127.0.0.1", h.ports["lmtp"]), "ann@example.org", [RCPT], mail)
            assert result.codes == (250,)
            shortage = [line for line in during if "cannot accept connections" in line]
            print(
                f"\nout of descriptors: soft limit {in_use} for 3 s, {len(waiting)} connections "
                f"waiting; masd used {cpu:.2f} s of CPU meanwhile; "
                f"{len(shortage)} log line(s) of {len(during)}: {shortage}"
            )
            assert len(shortage) == 1, "\n".join(during)
            assert "Too many open files (EMFILE)" in shortage[0]
            assert not [line for line in during if "Traceback" in line or "resource" in line]
            assert masd.running

    asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    """User and system time of process ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
