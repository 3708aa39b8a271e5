"""A flood of hostile mail to a bounce address, against masd as a process (docs/protocol.md §22).

Every acknowledgement carries a valid bounce address, so anyone who mails
``ticket@D`` can mail it back: here 255 KiB of blank lines, as a hostile run
sent, on six sessions at once.  Read on masd's event loop, each such mail held
LMTP, HTTP and the outbox for seconds.  What must hold: ``/healthz`` and the
intake of other mail go as fast during the flood as before it (measured in the
same run, within a generous ratio), every hostile mail is answered (recorded as
automated mail on its case, or ``451 4.3.2`` when too many wait), a repeat of
one costs no reading, and a real bounce sent after the flood is still read as
one.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path

import pytest
from support.bounces import postfix_dsn
from support.masd_process import WAIT
from support.watch import Watched, watched

from masd.testing import lmtpclient

pytestmark = pytest.mark.slow

ANN = "ann@example.org"
FLOOD = 6
ORDINARY = 8
BLANK_LINES = 255 * 1024 // 2


def hostile_mail(rcpt: str) -> bytes:
    head = (
        "From: MAILER-DAEMON@mx.example.net\r\n"
        f"To: {rcpt}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        f"Message-ID: <{secrets.token_hex(8)}@mx.example.net>\r\n\r\n"
    )
    return head.encode() + b"\r\n" * BLANK_LINES


async def lmtp(w: Watched, rcpt: str, data: bytes) -> lmtpclient.LmtpResult:
    target = ("127.0.0.1", w.setup.lmtp_port)
    return await lmtpclient.deliver(target, "", [rcpt], data, timeout=4 * WAIT)


async def sample_healthz(w: Watched, stop: asyncio.Event) -> list[float]:
    """Seconds each ``GET /healthz`` took, every 50 ms until ``stop``."""
    took: list[float] = []
    while not stop.is_set():
        began = time.perf_counter()
        answer = await w.http.get("/healthz")
        took.append(time.perf_counter() - began)
        assert answer.status_code == 200, answer.text
        await asyncio.sleep(0.05)
    return took


async def ordinary(w: Watched) -> list[float]:
    """Seconds each of :data:`ORDINARY` mails took to be recorded, one after another."""
    took = []
    for n in range(ORDINARY):
        began = time.perf_counter()
        await w.send("ticket@help.example", f"user{n}-{secrets.token_hex(2)}@example.org")
        took.append(time.perf_counter() - began)
    return took


async def measured(
    w: Watched, flood: list[bytes], rcpt: str
) -> tuple[list[float], list[float], list[lmtpclient.LmtpResult]]:
    stop = asyncio.Event()
    sampling = asyncio.create_task(sample_healthz(w, stop))
    hostile = [asyncio.create_task(lmtp(w, rcpt, data)) for data in flood]
    await asyncio.sleep(0.2 if flood else 0)  # the flood is under way
    intake = await ordinary(w)
    results = await asyncio.gather(*hostile)
    stop.set()
    return await sampling, intake, list(results)


async def bounce_reads(w: Watched) -> dict[str, float]:
    text = (await w.http.get("/metrics")).text
    found = {}
    for line in text.splitlines():
        if line.startswith("masd_bounce_reads_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = float(value)
    return found


async def story(w: Watched) -> None:
    await w.send("ticket@help.example", ANN)
    (ack,) = await w.sink.wait_for(1, WAIT)
    bounce_to = ack.mail_from
    assert "+bounce-" in bounce_to

    base_health, base_intake, _ = await measured(w, [], bounce_to)
    flood = [hostile_mail(bounce_to) for _ in range(FLOOD)]
    health, intake, results = await measured(w, flood, bounce_to)
    print(
        f"\n/healthz max {max(base_health) * 1000:.0f} ms before, {max(health) * 1000:.0f} ms"
        f" during {FLOOD} hostile bounces of {len(flood[0]) // 1024} KiB;"
        f" ordinary mail max {max(base_intake) * 1000:.0f} ms before,"
        f" {max(intake) * 1000:.0f} ms during; hostile answers"
        f" {sorted(r.recipients[0].final.code for r in results)}; reads {await bounce_reads(w)}"
    )
    for r in results:
        reply = r.recipients[0].final
        assert (reply.code, reply.enhanced) in ((250, "2.0.0"), (451, "4.3.2")), r
    # Read on the loop, one such mail held every listener for 2-3 s.
    assert max(health) <= max(0.5, 5 * max(base_health)), (base_health, health)
    assert max(intake) <= max(1.0, 5 * max(base_intake)), (base_intake, intake)

    # A repeat of a recorded one is answered as a duplicate, with no reading.
    recorded = [d for d, r in zip(flood, results, strict=True) if r.codes == (250,)]
    assert recorded, results
    before = await bounce_reads(w)
    again = await lmtp(w, bounce_to, recorded[0])
    assert again.codes == (250,), again
    assert "already recorded" in again.recipients[0].final.text, again
    assert await bounce_reads(w) == before

    # After the flood a real bounce is still read as one.
    real = await lmtp(w, bounce_to, postfix_dsn(bounce_to, ANN))
    assert real.codes == (250,), real
    page = await w.get("/mas/v0.1/cases/ticket=ticket-1@help.example/thread", limit=1000)
    kinds = [e["kind"] for e in page["entries"]]
    assert kinds.count("mail.bounced") == 1, kinds
    assert kinds.count("mail.in") == 1 + len(recorded), kinds


def test_a_flood_of_hostile_bounces_holds_up_no_listener(tmp_path: Path) -> None:
    async def main() -> None:
        async with watched(tmp_path) as w:
            await story(w)

    asyncio.run(main())
