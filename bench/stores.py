"""The store side by side: masd on SQLite, on PostgreSQL with one host, and with two hosts.

    python -m bench.stores [--mails N] [--statuses N] [--sessions S]

For each setup, ``masd serve`` processes (one, or two on one database) with a mode
endpoint and a mail relay on loopback (:mod:`masd.testing`), and a private PostgreSQL
server (:class:`masd.testing.postgres.PostgresServer`, ``fsync`` off: a throwaway
cluster, so PostgreSQL's figures leave out its disk flush while SQLite's include it).
Three loads, each measured from the first send to the last answer:

- intake: ``N`` mails to the master type over ``S`` concurrent LMTP sessions, spread
  evenly over the hosts; every ``250`` checked against the store afterwards;
- outbound: the acknowledgements those mails queued, counted at the relay, from the
  first ``250`` to the last acknowledgement received;
- status callbacks: ``!callback`` mails open handoffs first, then one
  ``handoff.status`` per handoff is posted, ``S`` at a time, spread over the hosts.

CPU per message is the CPU time of every masd process of the setup over the intake,
divided by the mails.  The load generators run in this process, on the same cores.
Nothing here asserts a time; a reply that is not ``250``/``200``, or a count in the
store that differs, stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from bench.common import cpu_seconds
from masd.testing import FakePeer, Recorded, SmtpSink, lmtpclient
from masd.testing.config import MasterSetup, write_master_config
from masd.testing.inbound import mx_mail
from masd.testing.net import free_ports
from masd.testing.postgres import PostgresServer, find_bindir
from masd.testing.process import MasdProcess

SETUPS = ("SQLite", "PostgreSQL, one host", "PostgreSQL, two hosts")


@dataclass(frozen=True)
class Row:
    setup: str
    mails: int
    intake_rate: float
    cpu_ms: float
    outbound_rate: float
    statuses: int
    status_rate: float


def configs(
    directory: Path, peer: FakePeer, sink: SmtpSink, uri: str | None, hosts: int
) -> list[MasterSetup]:
    first = write_master_config(
        directory / "h0", endpoint_url=peer.url + "mas", smtp_port=sink.port
    )
    text = first.config.read_text()
    if uri is not None:
        text = text.replace('database = "masd.db"\n', f'database = "{uri}"\n')
        first.config.write_text(text)
    setups = [first]
    for n in range(1, hosts):
        shutil.copytree(directory / "h0", directory / f"h{n}")
        lmtp, http = free_ports(2)
        path = directory / f"h{n}" / "masd.toml"
        path.write_text(
            text.replace(f"127.0.0.1:{first.lmtp_port}", f"127.0.0.1:{lmtp}").replace(
                f"127.0.0.1:{first.http_port}", f"127.0.0.1:{http}"
            )
        )
        setups.append(MasterSetup(path, lmtp, http, first.admin_token, first.endpoint_token))
    return setups


async def deliver_all(
    setups: Sequence[MasterSetup], rcpt: str, count: int, sessions: int, tag: str
) -> float:
    """``count`` mails over ``sessions`` concurrent sessions; seconds to the last ``250``.

    The mails are written before the clock starts: building one costs the load generator
    about 0.7 ms of CPU, on the machine masd is measured on."""
    queue: asyncio.Queue[tuple[int, str, bytes]] = asyncio.Queue()
    body = "phone: +1 555 0100\n" if "callback" in rcpt else "Hello.\n"
    for n in range(count):
        sender = f"{tag}{n}@example.org"
        queue.put_nowait((n, sender, mx_mail(sender, rcpt, subject=f"{tag} {n}", body=body)[1]))

    async def session(k: int) -> None:
        setup = setups[k % len(setups)]
        async with await lmtpclient.LmtpConnection.open(("127.0.0.1", setup.lmtp_port)) as conn:
            while not queue.empty():
                n, sender, data = queue.get_nowait()
                result = await conn.send(sender, [rcpt], data)
                if result.codes != (250,):
                    raise SystemExit(f"bench: mail {n} answered {result.codes}")

    began = time.monotonic()
    await asyncio.gather(*(session(k) for k in range(sessions)))
    return time.monotonic() - began


async def post_statuses(
    setups: Sequence[MasterSetup], requests: list[Recorded], sessions: int
) -> float:
    auth = {"Authorization": f"Bearer {setups[0].endpoint_token}"}
    queue: asyncio.Queue[tuple[int, Recorded]] = asyncio.Queue()
    for item in enumerate(requests):
        queue.put_nowait(item)

    async def client(http: httpx.AsyncClient, k: int) -> None:
        while not queue.empty():
            n, request = queue.get_nowait()
            message = {
                "mas_modes_version": "0.1",
                "type": "handoff.status",
                "id": secrets.token_hex(16),
                "case": request.json["case"],
                "handoff_id": request.json["handoff_id"],
                "seq": 1,
                "status": "running",
            }
            url = setups[(n + k) % len(setups)].messages_url
            answer = await http.post(url, json=message, headers=auth)
            if answer.status_code != 200:
                raise SystemExit(f"bench: status answered {answer.status_code}: {answer.text}")

    began = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.gather(*(client(http, k) for k in range(sessions)))
    return time.monotonic() - began


async def one_setup(
    name: str, workdir: Path, uri: str | None, hosts: int, o: argparse.Namespace
) -> Row:
    async with FakePeer() as peer, SmtpSink() as sink:
        setups = configs(workdir, peer, sink, uri, hosts)
        procs = [MasdProcess(s.config, workdir / f"masd{n}.log") for n, s in enumerate(setups)]
        for proc in procs:
            await proc.start()
        try:
            pids = [p.proc.pid for p in procs if p.proc is not None]
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            began = time.monotonic()
            intake = await deliver_all(setups, "ticket@help.example", o.mails, o.sessions, "u")
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
            await sink.wait_for(o.mails, 300)
            outbound = time.monotonic() - began
            await deliver_all(setups, "ticket!callback@help.example", o.statuses, o.sessions, "c")
            requests = await peer.wait_for(o.statuses, 300)
            status = await post_statuses(setups, requests[: o.statuses], o.sessions)
            check(setups[0], uri, o.mails + o.statuses, o.statuses)
        finally:
            for proc in procs:
                await proc.stop()
    return Row(
        name,
        o.mails,
        o.mails / intake,
        cpu * 1000 / o.mails,
        o.mails / outbound,
        o.statuses,
        o.statuses / status,
    )


def check(setup: MasterSetup, uri: str | None, messages: int, statuses: int) -> None:
    """What was answered is in the store: every mail once, every status recorded."""
    sql = (
        "SELECT (SELECT count(*) FROM messages), "
        "(SELECT count(*) FROM statuses WHERE status = 'running')"
    )
    if uri is None:
        import sqlite3

        with sqlite3.connect(setup.config.parent / "masd.db") as db:
            found = db.execute(sql).fetchone()
    else:
        with psycopg.connect(uri) as conn:
            found = conn.execute(sql).fetchone()
    if tuple(found) != (messages, statuses):
        raise SystemExit(f"bench: the store holds {found}, expected {(messages, statuses)}")


async def measure(o: argparse.Namespace) -> list[Row]:
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("bench: PostgreSQL is not installed (Debian: apt-get install postgresql)")
    top = Path(tempfile.mkdtemp(prefix="masd-bench-stores-"))
    rows = []
    try:
        rows.append(await one_setup(SETUPS[0], top / "sqlite", None, 1, o))
        with PostgresServer(bindir) as server:
            for n, (name, hosts) in enumerate(((SETUPS[1], 1), (SETUPS[2], 2))):
                server.create_database(f"bench{n}")
                uri = server.socket_uri(f"bench{n}")
                rows.append(await one_setup(name, top / f"pg{hosts}", uri, hosts, o))
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(top, ignore_errors=True)
    return rows


def render(rows: Sequence[Row], o: argparse.Namespace, command: str) -> list[str]:
    lines = [
        "| store | mails | intake (mails/s) | masd CPU per mail (ms) "
        "| outbound: acknowledgements at the relay (/s) | status callbacks "
        "| status callbacks (/s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.setup} | {r.mails} | {r.intake_rate:.0f} | {r.cpu_ms:.1f} | "
            f"{r.outbound_rate:.0f} | {r.statuses} | {r.status_rate:.0f} |"
        )
    lines += ["", f"Command: `{command}` ({o.sessions} concurrent LMTP sessions and HTTP clients)."]
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.stores", description=__doc__.splitlines()[0])
    p.add_argument("--mails", type=int, default=2000, help="mails of the intake (default 2000)")
    p.add_argument("--statuses", type=int, default=1000, help="status callbacks (default 1000)")
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions (default 8)")
    return p.parse_args(list(argv))


def run(argv: Sequence[str]) -> list[str]:
    """Measure; the markdown table (printed as well)."""
    o = parse(argv)
    rows = asyncio.run(measure(o))
    lines = render(rows, o, " ".join(["python", "-m", "bench.stores", *argv]))
    print("\n".join(lines), flush=True)
    return lines


if __name__ == "__main__":
    run(sys.argv[1:])
