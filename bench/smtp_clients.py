"""One SMTP client kind sending ``count`` messages to a relay; prints one JSON line.

    python -m bench.smtp_clients KIND HOST:PORT COUNT CONCURRENCY [--pool N]
    python -m bench.smtp_clients --signing COUNT

KIND:

- ``smtplib-per-mail``: a worker thread and a new connection per message
  (connect, EHLO, MAIL, RCPT, DATA, QUIT), as masd sent mail before;
- ``smtplib-pool``: N worker threads, each keeping one smtplib connection;
- ``aiosmtplib-pool``: N aiosmtplib connections kept on the event loop;
- ``masd``: :class:`masd.edges.smtp.SmtpTransport` (N connections), what masd runs.

CONCURRENCY sends are in flight at once (as the outbox has many queues).  CPU
is this process's (user + system) over the run, per message: the client's
cost, which in masd shares the event loop's interpreter lock with intake.

``--signing``: CPU per DKIM-signed acknowledgement (about 1 KB), dkimpy
against masd (:mod:`masd.edges.dkim`), one JSON line per signer.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import smtplib
import threading
import time
from collections.abc import Awaitable, Callable

import aiosmtplib

from bench.common import percentile

SENDER = "ticket=gs-1@help.example"
RCPT = "alice@example.org"


def message(n: int) -> bytes:
    body = "Your message has been received; we answer within a day.\r\n" * 12
    return (
        f"From: <{SENDER}>\r\nTo: <{RCPT}>\r\nSubject: Re: benchmark\r\n"
        f"Message-ID: <r{n}@help.example>\r\nAuto-Submitted: auto-replied\r\n\r\n{body}"
    ).encode()


Send = Callable[[int], Awaitable[bool]]


def per_mail(host: str, port: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    def one(n: int) -> bool:
        with smtplib.SMTP(host, port, local_hostname="bench.example", timeout=30) as smtp:
            smtp.sendmail(SENDER, [RCPT], message(n))
        return True

    async def send(n: int) -> bool:
        return await asyncio.to_thread(one, n)

    async def close() -> None:
        return None

    return send, close


def smtplib_pool(host: str, port: int, size: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    local = threading.local()
    opened: list[smtplib.SMTP] = []
    pool = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="smtp")

    def one(n: int) -> bool:
        smtp = getattr(local, "smtp", None)
        if smtp is None:
            smtp = local.smtp = smtplib.SMTP(host, port, local_hostname="bench.example", timeout=30)
            opened.append(smtp)
        smtp.sendmail(SENDER, [RCPT], message(n))
        return True

    async def send(n: int) -> bool:
        return await asyncio.get_running_loop().run_in_executor(pool, one, n)

    async def close() -> None:
        pool.shutdown()
        for smtp in opened:
            smtp.quit()

    return send, close


def aiosmtplib_pool(host: str, port: int, size: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    idle: asyncio.Queue[aiosmtplib.SMTP] = asyncio.Queue()
    opened: list[aiosmtplib.SMTP] = []

    async def send(n: int) -> bool:
        if idle.empty() and len(opened) < size:
            smtp = aiosmtplib.SMTP(hostname=host, port=port, local_hostname="bench.example")
            opened.append(smtp)
            await smtp.connect()
        else:
            smtp = await idle.get()
        try:
            await smtp.sendmail(SENDER, [RCPT], message(n))
        finally:
            idle.put_nowait(smtp)
        return True

    async def close() -> None:
        for smtp in opened:
            await smtp.quit()

    return send, close


def masd_transport(host: str, port: int, size: int) -> tuple[Send, Callable[[], Awaitable[None]]]:
    from masd.config import TcpListen
    from masd.edges.mailer import OutboundMail
    from masd.edges.smtp import SmtpTransport

    transport = SmtpTransport(
        TcpListen(host, port), hostname="bench.example", keys={}, connections=size
    )

    async def send(n: int) -> bool:
        result = await transport.send(OutboundMail(SENDER, RCPT, message(n), "help.example"))
        return result.ok

    return send, transport.close


async def run(kind: str, host: str, port: int, count: int, concurrency: int, size: int) -> dict:
    if kind == "smtplib-per-mail":
        send, close = per_mail(host, port)
    elif kind == "smtplib-pool":
        send, close = smtplib_pool(host, port, size)
    elif kind == "aiosmtplib-pool":
        send, close = aiosmtplib_pool(host, port, size)
    else:
        send, close = masd_transport(host, port, size)
    numbers = iter(range(count))
    latencies: list[float] = []
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for n in numbers:
            began = time.perf_counter()
            try:
                ok = await send(n)
            except (OSError, smtplib.SMTPException, aiosmtplib.SMTPException):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - began)
            else:
                failed += 1

    cpu, began = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    await close()
    return {
        "client": kind,
        "pool": size,
        "rate": len(latencies) / seconds,
        "cpu_ms": 1000 * cpu / count,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "failed": failed,
    }


def signing(count: int) -> list[dict[str, object]]:
    """CPU ms per signed message for each signer (keys made here)."""
    from pathlib import Path

    import dkim
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    from masd.config import Dkim
    from masd.edges.dkim import load_signer, sign

    def pem(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    rsa_pem = pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    ed_pem = pem(ed25519.Ed25519PrivateKey.generate())
    rsa_signer = load_signer(Dkim("r", Path("r"), rsa_pem), "help.example")
    ed_signer = load_signer(Dkim("e", Path("e"), ed_pem), "help.example")
    msg = message(1)
    heads = [b"from", b"to", b"subject", b"message-id", b"auto-submitted"]
    kinds = {
        "dkimpy RSA 2048": lambda: dkim.sign(
            msg,
            b"r",
            b"help.example",
            rsa_pem,
            canonicalize=(b"relaxed", b"relaxed"),
            include_headers=heads,
        ),
        "masd RSA 2048": lambda: sign(msg, [rsa_signer], 1.7e9),
        "masd Ed25519": lambda: sign(msg, [ed_signer], 1.7e9),
        "masd RSA 2048 + Ed25519": lambda: sign(msg, [rsa_signer, ed_signer], 1.7e9),
    }
    out: list[dict[str, object]] = []
    for name, fn in kinds.items():
        n = max(1, count // 20) if name.startswith("dkimpy") else count
        cpu = time.process_time()
        for _ in range(n):
            fn()
        out.append({"signer": name, "cpu_ms": 1000 * (time.process_time() - cpu) / n})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--signing", type=int, metavar="COUNT", help="measure DKIM signing instead")
    p.add_argument(
        "kind", nargs="?", choices=("smtplib-per-mail", "smtplib-pool", "aiosmtplib-pool", "masd")
    )
    p.add_argument("relay", nargs="?", help="HOST:PORT")
    p.add_argument("count", nargs="?", type=int)
    p.add_argument("concurrency", nargs="?", type=int)
    p.add_argument("--pool", type=int, default=4, help="connections kept (pool kinds)")
    a = p.parse_args()
    if a.signing:
        for row in signing(a.signing):
            print(json.dumps(row))
        return
    host, _, port = a.relay.rpartition(":")
    print(json.dumps(asyncio.run(run(a.kind, host, int(port), a.count, a.concurrency, a.pool))))


if __name__ == "__main__":
    main()
