"""A bare aiohttp endpoint: parses each POSTed JSON body and answers ``200 {"ok": true}``.

Two uses: the "bare endpoint" that status callbacks are compared with, and
the local sink masd's outbox delivers ``handoff.request`` to.  With
``--record FILE`` it keeps (arrival time, ``id``) of every message and
writes them to FILE as JSON when it stops (SIGTERM).  ``GET /count`` says
how many messages arrived.

    python -m bench.http_sink PORT [--record FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

from aiohttp import web


class Sink:
    def __init__(self, record: bool) -> None:
        self.record = record
        self.count = 0
        self.bad = 0
        self.arrivals: list[tuple[float, str]] = []

    async def post(self, request: web.Request) -> web.Response:
        try:
            message = await request.json()
        except ValueError:
            self.bad += 1
            return web.json_response({"ok": False, "error": "invalid-message"}, status=400)
        self.count += 1
        if self.record:
            self.arrivals.append((time.time(), str(message.get("id"))))
        return web.json_response({"ok": True})

    async def get_count(self, request: web.Request) -> web.Response:
        return web.json_response({"count": self.count, "bad": self.bad})


async def serve(port: int, record: Path | None) -> None:
    sink = Sink(record is not None)
    app = web.Application(client_max_size=256 * 1024)
    app.router.add_get("/count", sink.get_count)
    app.router.add_post("/{tail:.*}", sink.post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if record is not None:
        record.write_text(json.dumps({"count": sink.count, "arrivals": sink.arrivals}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--record", type=Path)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.record))
