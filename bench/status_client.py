"""``handoff.status`` posts over C keep-alive connections, each request timed; one JSON line.

    python -m bench.status_client URL TOKEN HANDOFFS CONNECTIONS SECONDS TAG SEQ0

The same posts as ``bench/status.lua`` (connection c takes every C-th handoff,
each round with the next seq from SEQ0 + 1), from a closed loop per
connection.  wrk's percentiles are not those of single requests (against a
server that answers every 50th request 200 ms late, 2% of them, wrk 4.1
reported a p90 of 155 ms), so the status table takes its latencies from here.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

from bench.common import percentile


async def run(
    url: str,
    token: str,
    handoffs: list[tuple[str, str]],
    conns: int,
    seconds: float,
    tag: str,
    seq0: int,
) -> dict[str, object]:
    latencies: list[float] = []
    failed = 0
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    until = time.monotonic() + seconds

    async def one(session: aiohttp.ClientSession, c: int) -> None:
        nonlocal failed
        mine = handoffs[c::conns]
        sent = 0
        while time.monotonic() < until:
            key, hid = mine[sent % len(mine)]
            body = {
                "mas_modes_version": "0.1",
                "type": "handoff.status",
                "id": f"{tag}-{c}-{sent}",
                "case": {"address": key, "key": key},
                "handoff_id": hid,
                "seq": seq0 + sent // len(mine) + 1,
                "status": "negotiating",
            }
            data = json.dumps(body).encode()
            began = time.perf_counter()
            async with session.post(url, data=data, headers=headers) as response:
                await response.read()
                ok = response.status == 200
            latencies.append(time.perf_counter() - began)
            failed += not ok
            sent += 1

    connector = aiohttp.TCPConnector(limit=conns)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(one(session, c) for c in range(conns)))
        took = time.perf_counter() - began
    return {
        "requests": len(latencies),
        "rate": len(latencies) / took,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
        "p999_ms": 1000 * percentile(latencies, 99.9),
        "max_ms": 1000 * max(latencies, default=float("nan")),
        "failed": failed,
    }


def main() -> None:
    url, token, path, conns, seconds, tag, seq0 = sys.argv[1:8]
    handoffs = [
        (line.split("\t")[0], line.split("\t")[1]) for line in Path(path).read_text().splitlines()
    ]
    result = asyncio.run(run(url, token, handoffs, int(conns), float(seconds), tag, int(seq0)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
