"""Hosts that add up: masd on PostgreSQL across a network, one to three hosts, SQLite beside it.

    python -m bench.pg_scale [--mails N] [--delay MS]

The database is where users put it, on another machine: every host reaches the private
PostgreSQL server (:class:`masd.testing.postgres.PostgresServer`) through a loopback proxy
that holds every packet ``--delay`` milliseconds each way (:mod:`masd.testing.tcp_proxy`,
1 ms: a rack; in a process of its own, :mod:`masd.testing.proxy_process`, so that it does
not wait for the load generator's interpreter lock), and over plain TCP with no delay for
the last row of each server.  Each server is measured with ``fsync`` off (a throwaway
cluster) and on (production: every commit flushed).  Rows:

- 1, 2 and 3 hosts at 2 LMTP sessions each, and 1 host at 8 sessions, through the proxy;
- 1 host at 8 sessions with no delay;
- SQLite, 8 sessions and 2 sessions, in the same run on the same machine.

Each row is ``masd serve`` processes on one fresh database (:mod:`bench.stores` writes their
configuration), ``N`` mails to the master type spread evenly over the hosts' sessions, from
the first send to the last ``250``; every ``250`` is checked against the store afterwards.
CPU per mail is the CPU time of every masd process over the intake, divided by the mails
(the load generator runs in this process, the proxy and the server in their own).  Nothing
here asserts a time; the targets are ratios of one run, printed with their verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds
from bench.stores import check, configs, deliver_all
from masd.testing import FakePeer, SmtpSink
from masd.testing.config import MasterSetup
from masd.testing.postgres import PostgresServer, find_bindir
from masd.testing.process import MasdProcess, MasdStartError
from masd.testing.proxy_process import ProxyProcess

#: (hosts, sessions per host, through the proxy) of each PostgreSQL row.
PG_ROWS = ((1, 2, True), (2, 2, True), (3, 2, True), (1, 8, True), (1, 8, False))
SQLITE_ROWS = ((1, 8), (1, 2))


@dataclass(frozen=True)
class Row:
    store: str  # "SQLite", "PostgreSQL fsync off", "PostgreSQL fsync on"
    hosts: int
    sessions: int
    delay_ms: float
    mails: int
    rate: float
    cpu_ms: float
    round_trips: float | None  # per mail, counted by the proxy


async def one_row(*args: Any) -> Row:
    """:func:`_row`, once more on fresh ports if a masd could not start (a port picked
    free was taken meanwhile by other work on the machine)."""
    try:
        return await _row(*args)
    except MasdStartError as exc:
        print(f"bench: a masd did not start, once more: {str(exc).splitlines()[-1]}")
        workdir = args[0]
        shutil.rmtree(workdir, ignore_errors=True)
        return await _row(*args)


async def _row(
    workdir: Path,
    store: str,
    uri: str | None,
    password: str | None,
    hosts: int,
    sessions: int,
    mails: int,
    proxy: ProxyProcess | None,
) -> Row:
    async with FakePeer() as peer, SmtpSink() as sink:
        setups = configs(workdir, peer, sink, uri, hosts)
        if password is not None:
            for setup in setups:
                _with_password(setup, password)
        procs = [MasdProcess(s.config, workdir / f"masd{n}.log") for n, s in enumerate(setups)]
        for proc in procs:
            await proc.start()
        try:
            pids = [p.proc.pid for p in procs if p.proc is not None]
            # A few mails first: connections opened, the bounce secret made.
            await deliver_all(setups, "ticket@help.example", 2 * hosts, hosts, "w")
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            trips0 = proxy.round_trips if proxy else 0
            seconds = await deliver_all(setups, "ticket@help.example", mails, hosts * sessions, "u")
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
            trips = (proxy.round_trips - trips0) / mails if proxy else None
            check(setups[0], _direct(uri, password), mails + 2 * hosts, 0)
        finally:
            for proc in procs:
                await proc.stop()
    delay = proxy.delay * 1000 if proxy else 0.0
    return Row(store, hosts, sessions, delay, mails, mails / seconds, cpu * 1000 / mails, trips)


def _with_password(setup: MasterSetup, password: str) -> None:
    secret = setup.config.parent / "secrets" / "database.password"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    text = setup.config.read_text()
    setup.config.write_text(
        text.replace(
            "\ndatabase = ",
            '\ndatabase_password_file = "secrets/database.password"\ndatabase = ',
            1,
        )
    )


def _direct(uri: str | None, password: str | None) -> str | None:
    if uri is None or password is None:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}password={password}"


async def measure(o: argparse.Namespace) -> list[Row]:
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("bench: PostgreSQL is not installed (Debian: apt-get install postgresql)")
    top = Path(tempfile.mkdtemp(prefix="masd-bench-pgscale-"))
    rows: list[Row] = []
    n = 0
    try:
        for hosts, sessions in SQLITE_ROWS:
            n += 1
            where = top / f"r{n}"
            rows.append(await one_row(where, "SQLite", None, None, hosts, sessions, o.mails, None))
        for fsync in (False, True):
            name = f"PostgreSQL fsync {'on' if fsync else 'off'}"
            with (
                PostgresServer(bindir, fsync=fsync) as server,
                ProxyProcess(("127.0.0.1", server.port), delay=o.delay / 1000) as proxy,
            ):
                for hosts, sessions, delayed in PG_ROWS:
                    n += 1
                    database = f"scale{n}"
                    server.create_database(database)
                    port = proxy.port if delayed else server.port
                    uri = f"postgresql://masd@127.0.0.1:{port}/{database}?sslmode=disable"
                    row = await one_row(
                        top / f"r{n}",
                        name,
                        uri,
                        server.password,
                        hosts,
                        sessions,
                        o.mails,
                        proxy if delayed else None,
                    )
                    rows.append(row)
                    print(_line(row), flush=True)
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(top, ignore_errors=True)
    return rows


def _line(r: Row) -> str:
    trips = "" if r.round_trips is None else f"{r.round_trips:.1f}"
    delay = f"{r.delay_ms:g} ms" if r.delay_ms else "none"
    return (
        f"| {r.store} | {r.hosts} | {r.sessions} | {delay} | {r.mails} | {r.rate:.0f} | "
        f"{r.cpu_ms:.1f} | {trips} |"
    )


def _find(rows: Sequence[Row], store: str, hosts: int, sessions: int, delayed: bool) -> Row | None:
    for r in rows:
        if (r.store, r.hosts, r.sessions, r.delay_ms > 0) == (store, hosts, sessions, delayed):
            return r
    return None


def targets(rows: Sequence[Row]) -> list[str]:
    """The targets of issue 29, as ratios of this run, with their verdict."""
    out = []
    sqlite = _find(rows, "SQLite", 1, 8, False)
    for store in ("PostgreSQL fsync off", "PostgreSQL fsync on"):
        one = _find(rows, store, 1, 2, True)
        two = _find(rows, store, 2, 2, True)
        three = _find(rows, store, 3, 2, True)
        eight = _find(rows, store, 1, 8, True)
        direct = _find(rows, store, 1, 8, False)
        checks: list[tuple[str, float | None, float]] = [
            ("2 hosts / 1 host (2 sessions each, 1 ms)", _ratio(two, one), 1.8),
            ("3 hosts / 1 host (2 sessions each, 1 ms)", _ratio(three, one), 2.5),
            ("1 host, 8 sessions, 1 ms (mails/s)", eight.rate if eight else None, 200),
            ("1 host, 8 sessions, no delay / SQLite 8 sessions", _ratio(direct, sqlite), 0.7),
        ]
        for what, got, want in checks:
            verdict = "n/a" if got is None else ("met" if got >= want else "not met")
            shown = "-" if got is None else f"{got:.2f}"
            out.append(f"| {store} | {what} | {shown} | >= {want:g} | {verdict} |")
    return out


def _ratio(a: Row | None, b: Row | None) -> float | None:
    return None if a is None or b is None else a.rate / b.rate


def render(rows: Sequence[Row], command: str) -> list[str]:
    lines = [
        "| store | hosts | LMTP sessions per host | delay each way | mails | intake (mails/s) "
        "| masd CPU per mail (ms) | round trips per mail |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
        *(_line(r) for r in rows),
        "",
        "| store | target | measured | wanted | verdict |",
        "|---|---|---:|---:|---|",
        *targets(rows),
        "",
        f"Command: `{command}`.",
    ]
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.pg_scale", description=__doc__.splitlines()[0]
    )
    p.add_argument("--mails", type=int, default=2000, help="mails per row (default 2000)")
    p.add_argument(
        "--delay", type=float, default=1.0, help="ms the proxy holds each packet (default 1)"
    )
    return p.parse_args(list(argv))


def run(argv: Sequence[str]) -> list[str]:
    """Measure; the markdown tables (printed as well)."""
    o = parse(argv)
    began = time.monotonic()
    rows = asyncio.run(measure(o))
    lines = render(rows, " ".join(["python", "-m", "bench.pg_scale", *argv]))
    lines.append(f"Run in {time.monotonic() - began:.0f} s.")
    print("\n".join(lines), flush=True)
    return lines


if __name__ == "__main__":
    run(sys.argv[1:])
