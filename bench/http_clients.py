"""HTTP clients side by side: ``count`` JSON posts at ``concurrency`` to the bench sink.

    python -m bench.http_clients KIND URL COUNT CONCURRENCY

KIND is ``httpx-aiohttp`` (masd's outbox client itself,
``masd.edges.contract_client.ContractClient``: httpx's ``AsyncClient`` over
httpx-aiohttp's transport, with its settings), ``aiohttp`` (raw: one
``ClientSession``, pool of 64) or ``httpx`` (httpx on its own pool of 64,
httpcore, for comparison).  Prints one JSON line: requests/s, client CPU
per request, p50/p99.
"""

from __future__ import annotations

import asyncio
import json
import resource
import secrets
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx

from bench.common import percentile
from masd.edges.contract_client import ContractClient

BODY = {
    "mas_modes_version": "0.1",
    "type": "handoff.request",
    "case": {"address": "ticket=gs-1@help.example", "key": "ticket=gs-1@help.example"},
    "handoff_id": "0" * 32,
    "mode": "callback",
    "details": {"subject": "benchmark", "phone": "+1 555 0100"},
    "status_url": "http://127.0.0.1:8025/mas/v0.1/messages",
    "participant": {"address": "bench@example.org"},
}
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench-token"}

Post = Callable[[bytes], Awaitable[int]]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _drive(post: Post, count: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    bad = 0
    todo = iter(range(count))

    async def worker() -> None:
        nonlocal bad
        for _ in todo:
            body = json.dumps({**BODY, "id": secrets.token_hex(16)}).encode()
            began = time.perf_counter()
            status = await post(body)
            latencies.append(time.perf_counter() - began)
            bad += status != 200

    cpu, began = _cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds, cpu = time.perf_counter() - began, _cpu() - cpu
    return {
        "requests": count,
        "failed": bad,
        "rate": count / seconds,
        "cpu_ms": 1000 * cpu / count,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


async def main(kind: str, url: str, count: int, concurrency: int) -> dict[str, float]:
    if kind == "httpx-aiohttp":
        client = ContractClient()
        try:

            async def post_masd(body: bytes) -> int:
                attempt = await client.post(url, body, HEADERS["Authorization"].split()[1])
                if attempt.result != "done":
                    print(f"{attempt.result}: {attempt.detail}", file=sys.stderr)
                return 200 if attempt.result == "done" else 599

            await _drive(post_masd, min(200, count), concurrency)  # warm the pool
            return await _drive(post_masd, count, concurrency)
        finally:
            await client.close()
    if kind == "httpx":
        pool = 64
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(10.0),
            limits=httpx.Limits(
                max_connections=pool, max_keepalive_connections=pool, keepalive_expiry=30.0
            ),
            follow_redirects=False,
            trust_env=False,
            http1=True,
            http2=False,
        ) as client:

            async def post_httpx(body: bytes) -> int:
                async with client.stream("POST", url, content=body, headers=HEADERS) as r:
                    await r.aread()
                    return r.status_code

            await _drive(post_httpx, min(200, count), concurrency)  # warm the pool
            return await _drive(post_httpx, count, concurrency)
    if kind == "aiohttp":
        connector = aiohttp.TCPConnector(limit=64, keepalive_timeout=30.0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=10.0), trust_env=False
        ) as session:

            async def post_aiohttp(body: bytes) -> int:
                async with session.post(
                    url, data=body, headers=HEADERS, allow_redirects=False
                ) as r:
                    await r.read()
                    return r.status

            await _drive(post_aiohttp, min(200, count), concurrency)
            return await _drive(post_aiohttp, count, concurrency)
    raise SystemExit(f"unknown client {kind!r}")


if __name__ == "__main__":
    kind, url, count, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps({"client": kind, **asyncio.run(main(kind, url, count, concurrency))}))
