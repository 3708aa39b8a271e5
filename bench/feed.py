"""The event feed under followers: LMTP intake with 0, 50 and 500 SSE followers, and replays.

    python -m bench.feed [--count 3000] [--followers 0,50,500] [--replays 10] [--fill 0]

One masd (``server.max_followers`` raised to the largest point), one LMTP
session sending ``--count`` messages per point (each a new case: a
``mail.in`` and its refused acknowledgement, two events).  The followers are
SSE clients in a child process (:func:`followers`) that read and count
everything they are sent; each point checks that every follower got every
event committed while it followed.  After each point the followers leave and
masd's RSS is measured again.  ``--replays`` clients then replay the whole
feed from the start while intake runs (``--fill`` adds that many cases to
the store first, written straight into it).  Prints figures; asserts no time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import fill
from bench import masd_setup as masd
from bench.common import PYTHON, ROOT, BenchError, Server, free_port
from bench.lmtp_load import latency_run

MB = 1024 * 1024
EVENTS = "/mas/v0.1/events"
#: Once in each event's SSE frame.
_MARK = b"\nevent: "


async def _one(port: int, token: str, replay: bool, counts: list[int], ready: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    path = EVENTS if replay else f"{EVENTS}?after={os.environ.get('FEED_AFTER', 'e0')}"
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: masd\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise BenchError(f"feed follower refused: {head[:200]!r}")
    ready.append(1)
    index = len(counts)
    counts.append(0)
    carry = b""
    while chunk := await reader.read(1 << 16):
        data = carry + chunk  # a mark cut between two reads is counted once
        counts[index] += data.count(_MARK)
        carry = data[1 - len(_MARK) :]


async def _followers(port: int, token: str, count: int, replay: bool) -> None:
    counts: list[int] = []
    ready: list[int] = []
    tasks = [asyncio.ensure_future(_one(port, token, replay, counts, ready)) for _ in range(count)]
    while len(ready) < count:
        await asyncio.sleep(0.05)
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    print("counts", min(counts, default=0), max(counts, default=0), flush=True)
    for t in tasks:
        t.cancel()


def followers(
    port: int, token: str, count: int, *, replay: bool, after: str
) -> subprocess.Popen[str]:
    """``count`` SSE followers in a child process, once all are connected."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "bench.feed", "--child", str(count), str(port), token, str(int(replay))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FEED_AFTER": after},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise BenchError(f"followers did not connect: {line!r}")
    return proc


def leave(proc: subprocess.Popen[str]) -> tuple[int, int]:
    """Stop the followers; the fewest and most events one of them got."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    for line in out.splitlines():
        if line.startswith("counts "):
            low, high = line.split()[1:]
            return int(low), int(high)
    raise BenchError(f"followers said nothing: {out!r}")


def _latest(setup: masd.MasdSetup) -> str:
    with masd.reading(setup.database) as db:
        return f"e{db.execute('SELECT IFNULL(MAX(pos), 0) FROM thread').fetchone()[0]}"


def _events(setup: masd.MasdSetup) -> int:
    with masd.reading(setup.database) as db:
        return int(db.execute("SELECT COUNT(*) FROM thread").fetchone()[0])


def intake(setup: masd.MasdSetup, count: int, tag: str) -> float:
    lat = asyncio.run(
        latency_run(setup.lmtp_port, 1, count, lambda n: f"ticket@{masd.DOMAIN}", tag=tag)
    )
    if lat.accepted != count:
        raise BenchError(f"{tag}: {lat.accepted} of {count} accepted ({lat.replies})")
    return lat.rate


def run(options: argparse.Namespace) -> None:
    work = Path(options.workdir)
    shutil.rmtree(work, ignore_errors=True)
    setup = masd.write_config(work, sink_port=free_port())
    most = max((*options.followers, options.replays, 1))
    text = setup.config.read_text()
    setup.config.write_text(text.replace("[server]\n", f"[server]\nmax_followers = {most}\n", 1))
    if options.fill:
        masd.migrate(setup)
        fill.fill(setup.database, cases=options.fill)
    server, _ = masd.start(setup, work / "masd.log")
    token = (work / "secrets" / "admin.token").read_text().strip()
    try:
        _points(options, setup, server, token)
    finally:
        server.stop()
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)


def _points(options: argparse.Namespace, setup: masd.MasdSetup, server: Server, token: str) -> None:
    print(f"== Event feed: {options.count:,} messages per point over 1 LMTP session")
    intake(setup, 200, "warm")
    base: float | None = None
    for n in options.followers:
        before = _events(setup)
        proc = (
            followers(setup.http_port, token, n, replay=False, after=_latest(setup)) if n else None
        )
        rss_with = server.rss() / MB
        cpu = server.cpu()
        rate = intake(setup, options.count, f"f{n}")
        cpu_ms = 1000 * (server.cpu() - cpu) / options.count
        time.sleep(1.0)  # the last events reach every follower
        rss_with = max(rss_with, server.rss() / MB)
        got = leave(proc) if proc is not None else (0, 0)
        added = _events(setup) - before
        time.sleep(2.0)
        rss_after = server.rss() / MB
        base = base or rate
        cost = 100 * (1 - rate / base)
        check = (
            ""
            if proc is None
            else f"; each follower got {got[0]:,}..{got[1]:,} of {added:,} events"
        )
        print(
            f"  {n:>4} followers: {rate:6.0f} msg/s ({-cost:+.0f} % vs none),"
            f" masd {cpu_ms:.1f} ms CPU/msg, RSS {rss_with:.0f} MB"
            f" while following, {rss_after:.0f} MB after they left{check}"
        )
        if proc is not None and got[0] < added:
            raise BenchError(f"{n} followers: one got {got[0]} of {added} events")
    if options.replays:
        total = _events(setup)
        proc = followers(setup.http_port, token, options.replays, replay=True, after="e0")
        cpu = server.cpu()
        rate = intake(setup, options.count, "replay")
        cpu_ms = 1000 * (server.cpu() - cpu) / options.count
        peak = server.rss() / MB
        got = leave(proc)
        time.sleep(2.0)
        print(
            f"  {options.replays:>4} replaying {total:,} events from the start: {rate:6.0f} msg/s"
            f" ({-100 * (1 - rate / (base or rate)):+.0f} %), masd {cpu_ms:.1f} ms CPU/msg"
            f" (replays included), RSS {peak:.0f} MB, after"
            f" {server.rss() / MB:.0f} MB; each replay got {got[0]:,}..{got[1]:,} events"
        )


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        count, port, token, replay = args[1:5]
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_followers(int(port), token, int(count), replay == "1"))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.feed", description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=3000, help="messages per point")
    p.add_argument("--followers", type=_ints, default=(0, 50, 500), help="e.g. 0,50,500")
    p.add_argument("--replays", type=int, default=10, help="clients replaying from the start")
    p.add_argument("--fill", type=int, default=0, help="cases written into the store first")
    p.add_argument("--workdir", default="/var/tmp/masd-bench/feed")
    p.add_argument("--keep", action="store_true")
    try:
        run(p.parse_args(args))
    except BenchError as exc:
        print(f"bench.feed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
