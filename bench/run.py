"""masd's benchmarks, in one run: LMTP intake, status callbacks, outbound, scale.

    python -m bench.run [--smoke] [--out docs/performance.md] [options]

Prints each table as it is measured, then the whole report; with ``--out``
the report replaces the part of that file between ``<!-- bench:begin -->``
and ``<!-- bench:end -->`` (the rest, the analysis, is kept).  Every server
runs on loopback, every load is bounded in count or time, and every check
of what masd stored is a hard failure (a message acknowledged with ``250``
but missing from the store stops the run).  Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import acks, fill, peers
from bench import masd_setup as masd
from bench.common import (
    PYTHON,
    ROOT,
    BenchError,
    Server,
    fmt,
    free_port,
    machine,
    masd_revision,
    percentile,
    ratio,
    wait_port,
)
from bench.lmtp_load import latency_run, source_run

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
MB = 1024 * 1024
#: masd-ack*: authenticated mail, acknowledgement mailed (bench/acks.py); masd, masd-callback:
#: unauthenticated mail (smtp-source), no acknowledgement: intake only.
ACK_PEERS = ("masd-ack", "masd-ack-dkim", "masd-callback-ack", "masd-callback-ack-dkim")
PEERS = (*ACK_PEERS, "masd", "masd-callback", "aiosmtpd", "smtp-sink", "dovecot", "mailman")
SECTIONS = ("intake", "status", "outbound", "smtp", "scale", "stores", "pgscale")


@dataclass(frozen=True)
class Options:
    count: int = 20_000
    latency_count: int = 2_000
    sessions: tuple[int, ...] = (1, 8, 20)
    size: int = 2048
    peers: tuple[str, ...] = PEERS
    sections: tuple[str, ...] = SECTIONS
    status_seconds: float = 10.0
    status_handoffs: int = 100_000
    outbox_rows: int = 100_000
    drain_seconds: float = 20.0
    clients_count: int = 5_000
    smtp_count: int = 5_000
    scale: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    scale_count: int = 5_000
    workdir: Path = Path("/var/tmp/masd-bench/run")
    mailman_venv: Path = Path("/var/tmp/masd-bench/mailman-venv")
    profile: Path | None = None
    masd_variant: str = ""
    out: Path | None = None
    keep: bool = False

    @classmethod
    def smoke(cls) -> Options:
        return cls(
            count=200,
            latency_count=100,
            sessions=(1, 8),
            status_seconds=1.0,
            status_handoffs=500,
            outbox_rows=500,
            drain_seconds=5.0,
            clients_count=300,
            smtp_count=200,
            scale=(200, 2_000),
            scale_count=200,
        )


# --------------------------------------------------------------------------- results


@dataclass
class IntakeRow:
    server: str
    sessions: int
    count: int
    rate: float
    cpu_ms: float
    p50_ms: float
    p99_ms: float
    latency_rate: float
    stored: str
    # The production path (bench/acks.py): the acknowledgements.
    ack_rate: float | None = None
    ack_p50_ms: float | None = None
    ack_p99_ms: float | None = None
    ack_lag_s: float | None = None


@dataclass
class Report:
    options: Options
    command: str
    machine: dict[str, str]
    started: str
    intake: list[IntakeRow] = field(default_factory=list)
    status: list[dict[str, Any]] = field(default_factory=list)
    outbound: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    smtp: list[dict[str, Any]] = field(default_factory=list)  # SMTP clients and DKIM signers
    restart: dict[str, Any] = field(default_factory=dict)
    scale: list[dict[str, Any]] = field(default_factory=list)
    rss: dict[str, float] = field(default_factory=dict)
    wal: dict[str, float] = field(default_factory=dict)  # masd's WAL file, MB
    stores: list[str] = field(default_factory=list)  # bench/stores.py's table
    pgscale: list[str] = field(default_factory=list)  # bench/pg_scale.py's tables
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def rate(self, server: str, sessions: int) -> float | None:
        for row in self.intake:
            if row.server == server and row.sessions == sessions:
                return row.rate
        return None


def say(text: str) -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


def stop_masd(report: Report, server: Server) -> None:
    """SIGTERM masd; anything but exit 0 (its store not closed cleanly) goes in the notes."""
    code = server.stop()
    if code != 0:
        tail = " / ".join(server.tail(2).splitlines())
        report.notes.append(f"masd in {server.log.parent.name} exited {code} on SIGTERM: {tail}")


@contextlib.contextmanager
def running_masd(report: Report, server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        stop_masd(report, server)


def sink(workdir: Path, record: bool = False) -> tuple[Server, Path]:
    port = free_port()
    path = workdir / "sink-arrivals.json"
    argv = [PYTHON, "-m", "bench.http_sink", str(port)]
    if record:
        argv += ["--record", str(path)]
    server = Server.spawn("http-sink", argv, workdir / "sink.log", port)
    wait_port(port, proc=server.proc)
    return server, path


def sink_count(server: Server) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/count", timeout=10) as r:
        return int(json.load(r)["count"])


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    until = time.monotonic() + timeout
    while not check():
        if time.monotonic() > until:
            raise BenchError(f"not within {timeout:g} s: {what}")
        time.sleep(0.2)


class Profiler:
    """py-spy recording one masd process for the length of a ``with`` block."""

    def __init__(self, directory: Path | None, name: str, pid: int) -> None:
        self.out = directory / f"{name}.txt" if directory else None
        self.pid = pid
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        spy = Path(PYTHON).with_name("py-spy")
        if self.out is None or not spy.exists():
            return self
        self.out.parent.mkdir(parents=True, exist_ok=True)
        # --gil: only the thread holding the GIL is sampled, so the shares are
        # of the one resource every Python thread of masd queues for.
        argv = [str(spy), "record", "-r", "200", "--format", "raw", "--threads", "--gil"]
        self.proc = subprocess.Popen(
            [*argv, "-o", str(self.out), "-p", str(self.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.out is not None and self.out.exists():
                from bench.profile import load, report

                summary = self.out.with_suffix(".summary.txt")
                summary.write_text(report(load(self.out), top=25))
                say(f"    profile: {summary}")


# --------------------------------------------------------------------------- 1. LMTP intake


def intake_point(
    report: Report,
    name: str,
    server: Server,
    port: int,
    rcpt: str,
    sessions: int,
    stored: Callable[[], int | None],
    *,
    profile: Path | None = None,
) -> IntakeRow:
    o = report.options
    server.check_alive()
    before = stored()
    cpu = server.cpu()
    with Profiler(profile, f"{name}-{sessions}", server.pid):
        seconds = source_run(port, sessions, o.count, rcpt, o.size, timeout=3600)
    cpu = server.cpu() - cpu
    tag = f"{name}-{sessions}-{os.getpid()}"
    # masd's pass is longer: its rate is what the production path is compared with.
    passes = max(o.latency_count, o.count // 4) if name.startswith("masd") else o.latency_count
    lat = asyncio.run(latency_run(port, sessions, passes, lambda _: rcpt, size=o.size, tag=tag))
    if lat.accepted != lat.sent:
        raise BenchError(
            f"{name}: {lat.sent - lat.accepted} of {lat.sent} not accepted: {lat.replies}"
        )
    expected = o.count + lat.accepted
    verdict = "not stored (discards)"
    if before is not None:

        def landed() -> bool:
            now = stored()
            return now is not None and now - before >= expected

        with contextlib.suppress(BenchError):
            wait_for(landed, 30, "")
        got = (stored() or 0) - before
        if got != expected:
            raise BenchError(f"{name} at {sessions} sessions: {expected} accepted, {got} stored")
        verdict = f"{got:,} of {expected:,}"
    row = IntakeRow(
        name,
        sessions,
        o.count,
        o.count / seconds,
        1000 * cpu / o.count,
        1000 * percentile(lat.latencies, 50),
        1000 * percentile(lat.latencies, 99),
        lat.rate,
        verdict,
    )
    say(
        f"  {name:<16} {sessions:>2} sessions: {fmt(row.rate)} msg/s,"
        f" {fmt(row.cpu_ms, 2)} ms CPU/msg,"
        f" p50 {fmt(row.p50_ms, 1)} ms, p99 {fmt(row.p99_ms, 1)} ms; stored {verdict}"
    )
    report.intake.append(row)
    return row


def outbound_steady(
    report: Report, database: Path, arrivals_file: Path, windows: list[tuple[int, float, float]]
) -> None:
    """Per intake point: handoff.request committed then, and how soon each reached the sink."""
    arrivals = json.loads(arrivals_file.read_text())["arrivals"]
    arrived = {mid: at for at, mid in arrivals}
    with masd.reading(database) as db:
        rows = db.execute(
            "SELECT json_extract(payload, '$.id'), created_at FROM outbox WHERE kind = 'contract'"
        ).fetchall()
    missing = [mid for mid, _ in rows if mid not in arrived]
    if missing:
        raise BenchError(f"{len(missing)} handoff.request never reached the sink")
    for sessions, began, ended in windows:
        mine = [(created, arrived[mid]) for mid, created in rows if began <= created <= ended]
        delays = [a - c for c, a in mine]
        in_window = sum(1 for _, a in mine if a <= ended)
        entry = {
            "sessions": sessions,
            "queued": len(mine),
            "delivered_in_window": in_window,
            "rate": in_window / (ended - began),
            "p50_ms": 1000 * percentile(delays, 50),
            "p99_ms": 1000 * percentile(delays, 99),
            "max_ms": 1000 * max(delays, default=float("nan")),
        }
        report.outbound.append(entry)
        say(
            f"  outbound during {sessions}-session !callback intake: {fmt(entry['rate'])} msg/s,"
            f" commit-to-delivery p50 {fmt(entry['p50_ms'], 1)} ms,"
            f" p99 {fmt(entry['p99_ms'], 1)} ms"
        )


@dataclass
class Target:
    """One LMTP server under test, started for the whole intake section."""

    name: str
    server: Server
    rcpt: str
    stored: Callable[[], int | None]
    sink: Server | None = None  # masd!callback: where its handoff.request go
    arrivals: Path | None = None
    database: Path | None = None
    windows: list[tuple[int, float, float]] = field(default_factory=list)
    relay: acks.Relay | None = None  # the production path: where acknowledgements go
    setup: masd.MasdSetup | None = None


def masd_target(
    report: Report,
    stack: contextlib.ExitStack,
    callback: bool,
    *,
    ack: bool = False,
    dkim: bool = False,
) -> Target:
    o = report.options
    name = (
        ("masd!callback" if callback else "masd")
        + ("+ack" if ack else "")
        + ("+dkim" if dkim else "")
    )
    slug = name.replace("!", "-").replace("+", "-")
    work = fresh(o.workdir / f"lmtp-{slug}")
    sink_server, arrivals_file = sink(work, record=callback and not ack)
    stack.callback(sink_server.stop)
    relay = acks.start_relay(work) if ack else None
    if relay is not None:
        stack.callback(relay.server.stop)
    setup = masd.write_config(
        work,
        sink_port=sink_server.port,
        relay_port=relay.server.port if relay else None,
        dkim=dkim,
    )
    server, ready = masd.start(setup, work / "masd.log", variant=o.masd_variant)
    stack.callback(stop_masd, report, server)
    report.restart.setdefault("ready_empty_s", ready)
    report.rss.setdefault("empty_store_ready", server.rss() / MB)

    def stored() -> int:
        c = masd.counts(setup.database)
        if callback and not c["messages"] == c["handoffs"] == c["contract"]:
            raise BenchError(f"{name}: a message without its handoff or request: {c}")
        return c["messages"]

    rcpt = f"ticket{'!callback' if callback else ''}@{masd.DOMAIN}"
    if ack:
        return Target(name, server, rcpt, stored, database=setup.database, relay=relay, setup=setup)
    if not callback:
        return Target(name, server, rcpt, stored, database=setup.database)
    return Target(name, server, rcpt, stored, sink_server, arrivals_file, setup.database)


def ack_point(report: Report, t: Target, sessions: int, profile: Path | None) -> IntakeRow:
    """A point of the production path (bench/acks.py), as a row of the intake table."""
    assert t.relay is not None
    assert t.setup is not None
    o = report.options
    with Profiler(profile, f"{t.name}-{sessions}", t.server.pid):
        got = acks.ack_point(
            t.server, t.setup, t.relay, name=t.name, sessions=sessions, count=o.count, size=o.size
        )
    t.stored()  # !callback: every message with its handoff and request
    row = IntakeRow(t.name, sessions, o.count, **got)
    say(
        f"  {t.name:<22} {sessions:>2} sessions: {fmt(row.rate)} msg/s,"
        f" {fmt(row.cpu_ms, 2)} ms CPU/msg, p99 {fmt(row.p99_ms, 1)} ms;"
        f" acknowledgements {fmt(row.ack_rate)}/s, 250 to sink p50 {fmt(row.ack_p50_ms, 1)} ms,"
        f" p99 {fmt(row.ack_p99_ms, 1)} ms, last {fmt(row.ack_lag_s, 2)} s after the last 250"
    )
    report.intake.append(row)
    return row


def peer_target(report: Report, stack: contextlib.ExitStack, name: str) -> Target:
    o = report.options
    work = fresh(o.workdir / f"lmtp-{name}")
    if name == "aiosmtpd":
        peer = peers.aiosmtpd_discard(work)
    elif name == "smtp-sink":
        peer = peers.smtp_sink(work)
    elif name == "dovecot":
        peer = peers.dovecot(work)
    else:
        peer = peers.mailman(work, o.mailman_venv)
    stack.callback(peer.server.stop)
    return Target(peer.name, peer.server, peer.rcpt, peer.stored)


def bench_intake(report: Report) -> None:
    """Every server is up for the whole section; each point is run on all of them in
    turn (sessions outer, servers inner), so load from elsewhere spreads evenly."""
    o = report.options
    say(f"\n== LMTP intake: {o.count:,} messages of {o.size} bytes per point (smtp-source -L -d)")
    with contextlib.ExitStack() as stack:
        targets: list[Target] = []
        for name in o.peers:
            why = None
            if name == "dovecot":
                why = peers.dovecot_available()
            elif name == "mailman":
                why = peers.mailman_available(o.mailman_venv)
            if why:
                report.notes.append(f"{name}: not measured: {why}.")
                say(f"  {name}: skipped: {why}")
            elif name in ("masd", "masd-callback", *ACK_PEERS):
                targets.append(
                    masd_target(
                        report,
                        stack,
                        callback=name.startswith("masd-callback"),
                        ack="-ack" in name,
                        dkim=name.endswith("-dkim"),
                    )
                )
            else:
                targets.append(peer_target(report, stack, name))
        for sessions in o.sessions:
            for t in targets:
                began = time.time()
                profile = o.profile if sessions == 8 and t.name.startswith("masd") else None
                if t.relay is not None:
                    ack_point(report, t, sessions, profile)
                else:
                    intake_point(
                        report,
                        t.name,
                        t.server,
                        t.server.port,
                        t.rcpt,
                        sessions,
                        t.stored,
                        profile=profile,
                    )
                t.windows.append((sessions, began, time.time()))
                if t.database is not None:
                    report.wal[f"{t.name}, after the {sessions}-session point"] = masd.wal_mb(
                        t.database
                    )
        for t in targets:
            if t.name.startswith("masd"):
                report.rss[f"after_{t.name}"] = t.server.rss() / MB
            if t.sink is None or t.database is None or t.arrivals is None:
                continue
            total = masd.counts(t.database)["contract"]
            sink_server = t.sink

            def arrived(sink_server: Server = sink_server, total: int = total) -> bool:
                return sink_count(sink_server) >= total

            wait_for(arrived, 600, f"the sink to receive all {total} handoff.request")
            sink_server.stop()  # it writes the arrivals file as it stops
            outbound_steady(report, t.database, t.arrivals, t.windows)


# --------------------------------------------------------------------------- 2. status callbacks


def wrk(
    url: str, connections: int, seconds: float, handoffs: Path, token: str, tag: str, seq0: int
) -> dict[str, Any]:
    binary = shutil.which("wrk")
    if binary is None:
        raise BenchError("wrk is missing (Debian package wrk)")
    threads = min(2, connections)
    argv = [
        binary,
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(ROOT / "bench" / "status.lua"),
        url,
        "--",
        str(handoffs),
        token,
        tag,
        str(threads),
        str(seq0),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            result: dict[str, Any] = json.loads(line[9:])
            return result
    raise BenchError(f"wrk gave no result (exit {out.returncode}): {out.stderr[-500:]}")


def status_row(
    target: str, connections: int, result: dict[str, Any], recorded: int | None
) -> dict[str, Any]:
    seconds = result["duration_us"] / 1e6
    errors = sum(result[k] for k in ("connect", "read", "write", "timeout"))
    row = {
        "target": target,
        "connections": connections,
        "requests": result["requests"],
        "rate": result["requests"] / seconds,
        "p50_ms": result["p50_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000,
        "non2xx": result["non2xx"],
        "errors": errors,
        "recorded": recorded,
    }
    say(
        f"  {target:<22} {connections:>2} conn: {fmt(row['rate'])} req/s,"
        f" p50 {fmt(row['p50_ms'], 2)} ms,"
        f" p99 {fmt(row['p99_ms'], 2)} ms, non-2xx {row['non2xx']}, errors {errors}"
        + (f", statuses recorded {recorded:,}" if recorded is not None else "")
    )
    return row


def timed_statuses(
    setup: masd.MasdSetup, handoffs: Path, connections: int, seconds: float, seq0: int
) -> dict[str, Any]:
    """bench/status_client.py: the same posts, each request's latency; all recorded."""
    before = masd.counts(setup.database)["mode_statuses"]
    argv = [setup.messages_url, setup.callback_token, str(handoffs), str(connections)]
    argv += [str(seconds), f"p{connections}", str(seq0 + 500_000)]
    exact: dict[str, Any] = json.loads(_tool("bench.status_client", argv)[-1])
    recorded = masd.counts(setup.database)["mode_statuses"] - before
    if exact["failed"] or recorded != exact["requests"]:
        raise BenchError(f"timed status posts: {exact}, {recorded} recorded")
    return exact


def bench_status(report: Report) -> None:
    o = report.options
    say(
        f"\n== Status callbacks: wrk, {o.status_seconds:g} s per point,"
        f" {o.status_handoffs:,} open handoffs"
    )
    if shutil.which("wrk") is None:
        report.notes.append(
            "status callbacks: not measured: wrk is not installed (apt-get install wrk)."
        )
        say("  skipped: wrk is not installed")
        return
    work = fresh(o.workdir / "status")
    sink_server, _ = sink(work)
    with running(sink_server):
        setup = masd.write_config(work, sink_port=sink_server.port)
        masd.migrate(setup)
        filled = fill.fill(setup.database, cases=o.status_handoffs, open_handoffs=o.status_handoffs)
        handoffs = work / "handoffs.tsv"
        handoffs.write_text("".join(f"{k}\t{h}\n" for k, h in filled.open_handoffs))
        server, _ready = masd.start(setup, work / "masd.log", variant=o.masd_variant)
        with running_masd(report, server):
            report.rss["open_handoffs_ready"] = server.rss() / MB
            seq0 = 0
            for connections in (1, 16):
                before = masd.counts(setup.database)["mode_statuses"]
                profile = o.profile if connections == 16 else None
                with Profiler(profile, f"status-{connections}", server.pid):
                    result = wrk(
                        setup.messages_url,
                        connections,
                        o.status_seconds,
                        handoffs,
                        setup.callback_token,
                        f"c{connections}",
                        seq0,
                    )
                time.sleep(0.5)  # requests wrk cut off at its deadline still commit
                recorded = masd.counts(setup.database)["mode_statuses"] - before
                row = status_row("masd", connections, result, recorded)
                if row["non2xx"] or row["errors"]:
                    raise BenchError(f"masd answered status posts with errors: {row}")
                if not result["requests"] <= recorded <= result["requests"] + connections:
                    raise BenchError(
                        f"{result['requests']} statuses answered 200, {recorded} recorded"
                        " (stale seq or lost writes)"
                    )
                exact = timed_statuses(setup, handoffs, connections, o.status_seconds, seq0)
                seq0 += 1_000_000
                row.update(
                    wrk_p50_ms=row["p50_ms"],
                    wrk_p99_ms=row["p99_ms"],
                    p50_ms=exact["p50_ms"],
                    p99_ms=exact["p99_ms"],
                    timed_rate=exact["rate"],
                )
                say(
                    f"  {'  each request timed':<22} {connections:>2} conn:"
                    f" {fmt(exact['rate'])} req/s, p50 {fmt(exact['p50_ms'], 2)} ms,"
                    f" p99 {fmt(exact['p99_ms'], 2)} ms, max {fmt(exact['max_ms'], 1)} ms"
                )
                report.status.append(row)
            report.rss["open_handoffs_after_status"] = server.rss() / MB
        for connections in (1, 16):
            result = wrk(
                f"http://127.0.0.1:{sink_server.port}/mas",
                connections,
                o.status_seconds,
                handoffs,
                "bare",
                f"b{connections}",
                0,
            )
            report.status.append(status_row("bare aiohttp (JSON only)", connections, result, None))
    say(
        f"  masd RSS with {o.status_handoffs:,} open handoffs:"
        f" {fmt(report.rss['open_handoffs_ready'])} MB"
        f" at ready, {fmt(report.rss['open_handoffs_after_status'])} MB after the status load"
    )
    if not o.keep:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- 3. outbound


def bench_outbound(report: Report) -> None:
    o = report.options
    say(f"\n== Restart with {o.outbox_rows:,} pending handoff.request, then the outbox drains")
    work = fresh(o.workdir / "restart")
    sink_server, _ = sink(work)
    with running(sink_server):
        setup = masd.write_config(work, sink_port=sink_server.port)
        masd.migrate(setup)
        fill.fill(
            setup.database,
            cases=o.outbox_rows,
            pending_outbox=o.outbox_rows,
            status_url=setup.messages_url,
            sink_url=setup.sink_url,
        )
        server, ready = masd.start(setup, work / "masd.log", variant=o.masd_variant)
        with running_masd(report, server), Profiler(o.profile, "outbox-drain", server.pid):
            began, cpu = time.monotonic(), server.cpu()
            until = began + o.drain_seconds
            while time.monotonic() < until and sink_count(sink_server) < o.outbox_rows:
                time.sleep(0.25)
            delivered, seconds = sink_count(sink_server), time.monotonic() - began
            cpu = server.cpu() - cpu
        # masd sent on until it stopped: compare what it marked done with
        # what the sink has now, not with the count at the end of the window.
        received = sink_count(sink_server)
        done = masd.counts(setup.database)["contract_done"]
        if done > received:
            raise BenchError(f"{done} outbox rows done, the sink received only {received}")
    report.restart.update(
        rows=o.outbox_rows,
        ready_s=ready,
        delivered=delivered,
        drain_s=seconds,
        drain_rate=delivered / seconds,
        cpu_ms=1000 * cpu / max(1, delivered),
        done=done,
    )
    say(
        f"  ready {ready:.2f} s after spawn"
        f" (empty store: {fmt(report.restart.get('ready_empty_s'), 2)} s);"
        f" then {delivered:,} delivered in {seconds:.1f} s = {fmt(delivered / seconds)} msg/s,"
        f" {fmt(1000 * cpu / max(1, delivered), 2)} ms masd CPU each; {done:,} marked done"
    )
    if not o.keep:
        shutil.rmtree(work, ignore_errors=True)

    say(f"\n== HTTP clients: {o.clients_count:,} JSON posts to a bare aiohttp sink")
    work = fresh(o.workdir / "clients")
    sink_server, _ = sink(work)
    with running(sink_server):
        url = f"http://127.0.0.1:{sink_server.port}/mas"
        for concurrency in (1, 16, 64):
            for kind in CLIENTS:
                row = http_client(kind, url, o.clients_count, concurrency)
                row["concurrency"] = concurrency
                report.clients.append(row)
                say(
                    f"  {kind:<13} {concurrency:>2} concurrent: {fmt(row['rate'])} req/s,"
                    f" {fmt(row['cpu_ms'], 3)} ms client CPU/req, p50 {fmt(row['p50_ms'], 2)} ms,"
                    f" p99 {fmt(row['p99_ms'], 2)} ms"
                )
            mine = client_rate(report, "httpx-aiohttp", concurrency)
            raw = client_rate(report, "aiohttp", concurrency)
            say(f"  httpx-aiohttp / aiohttp at {concurrency}: {ratio(mine, raw)}")


#: Clients of the HTTP clients bench: masd's (httpx over aiohttp), raw aiohttp, httpx alone.
CLIENTS = ("httpx-aiohttp", "aiohttp", "httpx")


def http_client(kind: str, url: str, count: int, concurrency: int) -> dict[str, Any]:
    """One run of bench.http_clients in its own process: its JSON line."""
    out = subprocess.run(
        [PYTHON, "-m", "bench.http_clients", kind, url, str(count), str(concurrency)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise BenchError(f"http client {kind} failed: {out.stderr[-500:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if row["failed"]:
        raise BenchError(
            f"http client {kind}: {row['failed']} requests failed: {out.stderr[-500:]}"
        )
    return row


def client_rate(r: Report, kind: str, concurrency: int) -> float | None:
    for c in r.clients:
        if c["client"] == kind and c["concurrency"] == concurrency:
            return float(c["rate"])
    return None


# --------------------------------------------------------------------------- 4. SMTP clients


def bench_smtp(report: Report) -> None:
    """The SMTP clients masd could send with, and DKIM signing, each in a process of its own."""
    o = report.options
    say(f"\n== SMTP clients: {o.smtp_count:,} messages to smtp-sink, 16 sends in flight")
    work = fresh(o.workdir / "smtp-clients")
    relay = acks.start_relay(work)
    runs = [("smtplib-per-mail", 4), ("smtplib-pool", 4), ("aiosmtplib-pool", 4)]
    runs += [("masd", n) for n in (1, 2, 4, 8)]
    with running(relay.server):
        address = f"127.0.0.1:{relay.server.port}"
        for kind, pool in runs:
            argv = [kind, address, str(o.smtp_count), "16", "--pool", str(pool)]
            row = json.loads(_tool("bench.smtp_clients", argv)[-1])
            if row["failed"]:
                raise BenchError(f"SMTP client {kind}: {row['failed']} messages failed")
            report.smtp.append(row)
            say(
                f"  {kind:<17} {pool} sessions: {fmt(row['rate'])} msg/s,"
                f" {fmt(row['cpu_ms'], 3)} ms client CPU/msg, p50 {fmt(row['p50_ms'], 2)} ms,"
                f" p99 {fmt(row['p99_ms'], 2)} ms"
            )
    for line in _tool("bench.smtp_clients", ["--signing", str(max(50, o.smtp_count // 5))]):
        row = json.loads(line)
        report.smtp.append(row)
        say(f"  {row['signer']:<24} {fmt(row['cpu_ms'], 3)} ms CPU per signed message")
    if not o.keep:
        shutil.rmtree(work, ignore_errors=True)


def _tool(module: str, argv: list[str]) -> list[str]:
    out = subprocess.run(
        [PYTHON, "-m", module, *argv],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise BenchError(f"{module} {' '.join(argv)} failed: {out.stderr[-500:]}")
    return out.stdout.strip().splitlines()


# --------------------------------------------------------------------------- 5. scale


def bench_scale(report: Report) -> None:
    o = report.options
    say(
        f"\n== Scale: {o.scale_count:,} messages at 8 sessions"
        " (half new cases, half replies to a random case)"
    )
    for size in o.scale:
        work = fresh(o.workdir / f"scale-{size}")
        setup = masd.write_config(work, sink_port=free_port())
        masd.migrate(setup)
        filled = fill.fill(setup.database, cases=size)
        db_mb = setup.database.stat().st_size / MB
        server, ready = masd.start(setup, work / "masd.log", variant=o.masd_variant)
        rng = random.Random(size)

        def rcpt(n: int, size: int = size, rng: random.Random = rng) -> str:
            if n % 2:
                return f"ticket@{masd.DOMAIN}"
            return f"ticket=gs-{rng.randint(1, size)}@{masd.DOMAIN}"

        with running_masd(report, server):
            before = masd.counts(setup.database)["messages"]
            cpu = server.cpu()
            lat = asyncio.run(
                latency_run(
                    setup.lmtp_port, 8, o.scale_count, rcpt, size=o.size, tag=f"scale{size}"
                )
            )
            cpu = server.cpu() - cpu
            time.sleep(0.2)
            got = masd.counts(setup.database)["messages"] - before
            rss = server.rss() / MB
        if lat.accepted != o.scale_count or got != lat.accepted:
            raise BenchError(f"scale {size}: {lat.accepted} accepted ({lat.replies}), {got} stored")
        row = {
            "cases": size,
            "fill_s": filled.seconds,
            "db_mb": db_mb,
            "ready_s": ready,
            "rate": lat.rate,
            "cpu_ms": 1000 * cpu / lat.accepted,
            "p50_ms": 1000 * percentile(lat.latencies, 50),
            "p99_ms": 1000 * percentile(lat.latencies, 99),
            "rss_mb": rss,
            "stored": got,
        }
        report.scale.append(row)
        say(
            f"  {size:>9,} cases ({fmt(db_mb)} MB, filled in {filled.seconds:.0f} s):"
            f" {fmt(row['rate'])} msg/s, {fmt(row['cpu_ms'], 2)} ms CPU/msg,"
            f" p50 {fmt(row['p50_ms'], 1)} ms, p99 {fmt(row['p99_ms'], 1)} ms,"
            f" RSS {fmt(rss)} MB, ready {ready:.2f} s; stored {got:,}"
        )
        if not o.keep:
            shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- the report


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def targets(r: Report) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for the issue's targets that this run measured."""
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    out += acks.targets(r.intake)
    masd8, discard8, mailman8 = (
        r.rate("masd", 8),
        r.rate("aiosmtpd-discard", 8),
        r.rate("mailman3-lmtp", 8),
    )
    if masd8 and discard8:
        out.append(
            (
                "LMTP intake only (unauthenticated) at 8 sessions >= 0.5x bare aiosmtpd",
                f"{fmt(masd8)} vs {fmt(discard8)} msg/s = {masd8 / discard8:.2f}x",
                verdict(masd8 >= 0.5 * discard8),
            )
        )
    if masd8 and mailman8:
        out.append(
            (
                "LMTP intake at 8 sessions ahead of Mailman 3",
                f"{fmt(masd8)} vs {fmt(mailman8)} msg/s = {masd8 / mailman8:.2f}x",
                verdict(masd8 > mailman8),
            )
        )
    for row in r.status:
        if row["target"] != "masd":
            continue
        c = row["connections"]
        if c == 16:
            ok = row["rate"] >= 2000 and row["p99_ms"] <= 12
            out.append(
                (
                    "callbacks >= 2,000/s, p99 <= 12 ms at 16 connections",
                    f"{fmt(row['rate'])}/s, p99 {fmt(row['p99_ms'], 2)} ms",
                    verdict(ok),
                )
            )
        if c == 1:
            out.append(
                (
                    "callbacks p99 <= 5 ms at 1 connection",
                    f"p99 {fmt(row['p99_ms'], 2)} ms",
                    verdict(row["p99_ms"] <= 5),
                )
            )
    if r.restart.get("drain_rate"):
        rate = r.restart["drain_rate"]
        out.append(
            (
                "outbound >= 1,000 contract messages/s through httpx (aiohttp transport)",
                f"{fmt(rate)}/s (outbox draining a backlog)",
                verdict(rate >= 1000),
            )
        )
    for concurrency in (16, 64):
        mine = client_rate(r, "httpx-aiohttp", concurrency)
        raw = client_rate(r, "aiohttp", concurrency)
        if mine and raw:
            out.append(
                (
                    f"httpx (aiohttp transport) beside raw aiohttp, {concurrency} concurrent posts",
                    f"{fmt(mine)} vs {fmt(raw)} req/s = {ratio(mine, raw)}",
                    verdict(mine >= 1000),
                )
            )
    if len(r.scale) >= 2:
        base = r.scale[0]["cpu_ms"]
        worst = max(abs(s["cpu_ms"] / base - 1) for s in r.scale)
        shown = ", ".join(f"{s['cases']:,}: {fmt(s['cpu_ms'], 2)} ms" for s in r.scale)
        out.append(("per-message CPU flat (±20%) as cases grow", shown, verdict(worst <= 0.2)))
    if "open_handoffs_after_status" in r.rss:
        rss = max(r.rss["open_handoffs_ready"], r.rss["open_handoffs_after_status"])
        out.append(
            (
                f"RSS <= 200 MB with {r.options.status_handoffs:,} open handoffs",
                f"{fmt(rss)} MB",
                verdict(rss <= 200),
            )
        )
    if r.restart.get("ready_s") is not None:
        out.append(
            (
                f"restart-to-ready <= 5 s with {r.options.outbox_rows:,} pending outbox rows",
                f"{r.restart['ready_s']:.2f} s",
                verdict(r.restart["ready_s"] <= 5),
            )
        )
    return out


def render(r: Report) -> str:
    o = r.options
    lines = [
        BEGIN,
        "",
        f"Measured {r.started} in {r.seconds / 60:.1f} min with:",
        "",
        "```sh",
        r.command,
        "```",
        "",
        *_table(["machine", ""], [[k, v] for k, v in r.machine.items()]),
        "",
    ]
    lines += acks.render(r.intake, o.count, o.sessions)
    source_rows = [row for row in r.intake if row.ack_rate is None]
    servers = list(dict.fromkeys(row.server for row in source_rows))

    def order(row: IntakeRow) -> tuple[int, int]:
        return servers.index(row.server), row.sessions

    if source_rows:
        lines += [
            f"### LMTP intake only: 2 KB messages, {o.count:,} per point",
            "",
            "Unauthenticated mail (no Authentication-Results): masd records it and refuses the "
            "acknowledgement (Principle 10), so no mail leaves. "
            "msg/s: `smtp-source -L -d` (Postfix) sending the point's messages. CPU: the server's "
            "processes (user + system, from /proc) over that pass, per message. Latency: a "
            f"separate pass of {o.latency_count:,} messages "
            f"({max(o.latency_count, o.count // 4):,} for masd) at the same sessions from a Python "
            "client, from `MAIL FROM` to the reply after the final dot. stored: rows or files "
            "found afterwards for every message answered `250`.",
            "",
        ]
        lines += _table(
            ["server", "sessions", "msg/s", "CPU ms/msg", "p50 ms", "p99 ms", "stored"],
            [
                [
                    row.server,
                    str(row.sessions),
                    fmt(row.rate),
                    fmt(row.cpu_ms, 2),
                    fmt(row.p50_ms, 1),
                    fmt(row.p99_ms, 1),
                    row.stored,
                ]
                for row in sorted(source_rows, key=order)
            ],
        )
        others = [
            s
            for s in ("aiosmtpd-discard", "smtp-sink", "dovecot-lmtp", "mailman3-lmtp", "masd")
            if any(row.server == s for row in source_rows)
        ]
        body = []
        for subject in ("masd", "masd!callback"):
            for n in o.sessions:
                mine = r.rate(subject, n)
                if mine is not None:
                    body.append(
                        [subject, str(n)]
                        + [ratio(mine, r.rate(s, n)) if s != subject else "-" for s in others]
                    )
        if body:
            lines += ["", "Ratios of msg/s (masd / the other server):", ""]
            lines += _table(["", "sessions", *[f"/ {s}" for s in others]], body)
        lines.append("")
    if r.outbound:
        lines += [
            "### Outbound during `!callback` intake",
            "",
            "Each `!callback` mail queues one `handoff.request` for the local sink. Delay: from "
            "the recording's timestamp (taken just before its commit) to arrival at the sink.",
            "",
        ]
        lines += _table(
            [
                "intake sessions",
                "queued",
                "delivered in the window",
                "msg/s",
                "p50 ms",
                "p99 ms",
                "max ms",
            ],
            [
                [
                    str(e["sessions"]),
                    fmt(e["queued"]),
                    fmt(e["delivered_in_window"]),
                    fmt(e["rate"]),
                    fmt(e["p50_ms"], 1),
                    fmt(e["p99_ms"], 1),
                    fmt(e["max_ms"], 1),
                ]
                for e in r.outbound
            ],
        )
        lines.append("")
    if r.restart.get("drain_rate") is not None:
        x = r.restart
        lines += [
            f"### Restart with {x['rows']:,} pending `handoff.request` rows",
            "",
            *_table(
                [
                    "ready (spawn to READY=1)",
                    "ready, empty store",
                    "delivered",
                    "in",
                    "msg/s",
                    "masd CPU ms/msg",
                ],
                [
                    [
                        f"{x['ready_s']:.2f} s",
                        f"{fmt(x.get('ready_empty_s'), 2)} s",
                        fmt(x["delivered"]),
                        f"{x['drain_s']:.1f} s",
                        fmt(x["drain_rate"]),
                        fmt(x["cpu_ms"], 2),
                    ]
                ],
            ),
            "",
        ]
    if r.clients:
        lines += [
            f"### HTTP clients: {o.clients_count:,} JSON posts to a bare aiohttp sink",
            "",
            "`httpx-aiohttp`: masd's outbox client itself (httpx's `AsyncClient` over "
            "httpx-aiohttp's transport: HTTP/1.1 keep-alive, "
            "the answer's start read raw); `aiohttp`: raw, one `ClientSession`, pool 64; "
            "`httpx`: httpx on its own pool (httpcore), pool 64. CPU: the client process.",
            "",
        ]
        lines += _table(
            ["client", "concurrent", "req/s", "client CPU ms/req", "p50 ms", "p99 ms"],
            [
                [
                    c["client"],
                    str(c["concurrency"]),
                    fmt(c["rate"]),
                    fmt(c["cpu_ms"], 3),
                    fmt(c["p50_ms"], 2),
                    fmt(c["p99_ms"], 2),
                ]
                for c in r.clients
            ],
        )
        shown = sorted({c["concurrency"] for c in r.clients})
        lines += [
            "",
            "httpx-aiohttp / aiohttp, same run: "
            + ", ".join(
                f"{ratio(client_rate(r, 'httpx-aiohttp', n), client_rate(r, 'aiohttp', n))} at {n}"
                for n in shown
            )
            + ".",
        ]
        lines.append("")
    lines += _smtp_tables(r)
    if r.status:
        lines += [
            f"### Status callbacks: `handoff.status` posts, {o.status_seconds:g} s per point",
            "",
            f"wrk with `bench/status.lua`: fresh ids, increasing seq, over {o.status_handoffs:,} "
            "open handoffs; the bare endpoint parses the same JSON and answers 200. "
            "req/s: wrk. p50, p99 for masd: a second pass of the same length and connections "
            "from `bench/status_client.py`, which times each request (wrk's percentiles are "
            "not per request: against a server answering 2% of requests 200 ms late it "
            "reported a p90 of 155 ms); wrk p99: wrk's figure. "
            "recorded: statuses found in the store afterwards (of the wrk pass).",
            "",
        ]
        lines += _table(
            [
                "endpoint",
                "connections",
                "req/s",
                "p50 ms",
                "p99 ms",
                "wrk p99 ms",
                "non-2xx",
                "recorded",
            ],
            [
                [
                    s["target"],
                    str(s["connections"]),
                    fmt(s["rate"]),
                    fmt(s["p50_ms"], 2),
                    fmt(s["p99_ms"], 2),
                    fmt(s.get("wrk_p99_ms", s["p99_ms"]), 2),
                    str(s["non2xx"] + s["errors"]),
                    fmt(s["recorded"]) if s["recorded"] is not None else "-",
                ]
                for s in r.status
            ],
        )
        masd16 = next(
            (s for s in r.status if s["target"] == "masd" and s["connections"] == 16), None
        )
        bare16 = next(
            (s for s in r.status if s["target"] != "masd" and s["connections"] == 16), None
        )
        if masd16 and bare16:
            lines += [
                "",
                f"masd / bare at 16 connections: {ratio(masd16['rate'], bare16['rate'])}.",
            ]
        lines.append("")
    if r.scale:
        lines += [
            "### Scale: cost per message as the store grows",
            "",
            f"{o.scale_count:,} messages at 8 sessions from the Python client, half opening a "
            "case, half replying to a random existing case; the store filled beforehand with "
            "SQL (`bench/fill.py`: each case with its 2 KB message, dedupe row and thread).",
            "",
        ]
        lines += _table(
            ["cases", "store MB", "ready s", "msg/s", "CPU ms/msg", "p50 ms", "p99 ms", "RSS MB"],
            [
                [
                    fmt(s["cases"]),
                    fmt(s["db_mb"]),
                    f"{s['ready_s']:.2f}",
                    fmt(s["rate"]),
                    fmt(s["cpu_ms"], 2),
                    fmt(s["p50_ms"], 1),
                    fmt(s["p99_ms"], 1),
                    fmt(s["rss_mb"]),
                ]
                for s in r.scale
            ],
        )
        lines.append("")
    if r.rss:
        names = {
            **{f"after_{n}": f"after the intake points ({n})" for n in servers},
            **{
                f"after_{row.server}": f"after the intake points ({row.server})" for row in r.intake
            },
            "empty_store_ready": "empty store, at ready",
            "after_masd": "after the intake points (masd)",
            "after_masd!callback": "after the intake points (masd!callback)",
            "open_handoffs_ready": f"{o.status_handoffs:,} open handoffs, at ready",
            "open_handoffs_after_status": (
                f"{o.status_handoffs:,} open handoffs, after the status load"
            ),
        }
        lines += ["### masd resident memory", ""]
        lines += _table(["when", "RSS MB"], [[names.get(k, k), fmt(v)] for k, v in r.rss.items()])
        lines.append("")
    if r.wal:
        lines += [
            "### masd's write-ahead log",
            "",
            "Size of `masd.db-wal` while masd runs (the WAL is reused from its start once a "
            "checkpoint has copied all of it; it shrinks only when masd closes the store).",
            "",
        ]
        lines += _table(["when", "WAL MB"], [[k, fmt(v)] for k, v in r.wal.items()])
        lines.append("")
    if r.stores:
        lines += [
            "### SQLite, PostgreSQL with one host, PostgreSQL with two hosts (bench/stores.py)",
            "",
            *r.stores,
            "",
        ]
    if r.pgscale:
        lines += [
            "### PostgreSQL across a network: 1, 2 and 3 hosts (bench/pg_scale.py)",
            "",
            *r.pgscale,
            "",
        ]
    found = targets(r)
    if found:
        lines += ["### Targets", ""]
        lines += _table(["target", "measured", ""], [list(t) for t in found])
        lines.append("")
    if r.notes:
        lines += ["Notes:", "", *[f"- {n}" for n in r.notes], ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _smtp_tables(r: Report) -> list[str]:
    clients = [c for c in r.smtp if "client" in c]
    signers = [c for c in r.smtp if "signer" in c]
    lines: list[str] = []
    if clients:
        lines += [
            f"### SMTP clients: {r.options.smtp_count:,} acknowledgements to smtp-sink",
            "",
            "16 sends in flight (the outbox sends many at once). `smtplib-per-mail`: a worker "
            "thread and a new connection per message, as masd sent before; `smtplib-pool`: "
            "worker threads each keeping one connection; `aiosmtplib-pool`: connections kept on "
            "the event loop; `masd`: masd's `SmtpTransport` (its own client, kept sessions, "
            "pipelined). CPU: the client process, per message.",
            "",
        ]
        lines += _table(
            ["client", "sessions", "msg/s", "client CPU ms/msg", "p50 ms", "p99 ms"],
            [
                [
                    c["client"],
                    str(c["pool"]) if c["client"] != "smtplib-per-mail" else "1 per message",
                    fmt(c["rate"]),
                    fmt(c["cpu_ms"], 3),
                    fmt(c["p50_ms"], 2),
                    fmt(c["p99_ms"], 2),
                ]
                for c in clients
            ],
        )
        lines.append("")
    if signers:
        lines += ["### DKIM signing: CPU per signed acknowledgement (about 1 KB)", ""]
        lines += _table(
            ["signer", "CPU ms/msg"], [[c["signer"], fmt(c["cpu_ms"], 3)] for c in signers]
        )
        lines.append("")
    return lines


def write_out(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        head, _, rest = old.partition(BEGIN)
        _, _, tail = rest.partition(END)
        new = head + text.rstrip("\n") + tail
    else:
        new = "# masd performance\n\n" + text + old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


# --------------------------------------------------------------------------- main


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())


def _names(text: str, allowed: Sequence[str]) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    for n in names:
        if n not in allowed:
            raise SystemExit(f"unknown name {n!r}: choose from {', '.join(allowed)}")
    return names


def parse(argv: Sequence[str]) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--smoke", action="store_true", help="tiny counts (CI): the benchmark still works"
    )
    p.add_argument("--count", type=int, help="messages per LMTP intake point (smtp-source)")
    p.add_argument("--latency-count", type=int, help="messages per latency pass")
    p.add_argument("--sessions", help="LMTP sessions per point, e.g. 1,8,20")
    p.add_argument("--peers", help=f"LMTP servers to measure, from {','.join(PEERS)}")
    p.add_argument("--sections", help=f"what to run, from {','.join(SECTIONS)}")
    p.add_argument("--status-seconds", type=float)
    p.add_argument("--status-handoffs", type=int)
    p.add_argument("--outbox-rows", type=int)
    p.add_argument("--drain-seconds", type=float)
    p.add_argument("--clients-count", type=int)
    p.add_argument("--smtp-count", type=int, help="messages per SMTP client run")
    p.add_argument("--scale", help="cases in the store per scale point, e.g. 1000,100000,1000000")
    p.add_argument("--scale-count", type=int)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--mailman-venv", type=Path)
    p.add_argument(
        "--profile",
        type=Path,
        help="write py-spy profiles (--gil) of masd here: intake at 8 sessions, status at 16"
        " connections, the outbox drain",
    )
    p.add_argument(
        "--masd-variant",
        help="run masd with proposed changes (bench/masd_variant.py), e.g. aiohttp-outbox",
    )
    p.add_argument("--out", type=Path, help="markdown file to write the report into")
    p.add_argument("--keep", action="store_true", help="keep the stores (disk!)")
    a = p.parse_args(argv)
    o = Options.smoke() if a.smoke else Options()
    changes: dict[str, Any] = {}
    for name in (
        "count",
        "latency_count",
        "status_seconds",
        "status_handoffs",
        "outbox_rows",
        "drain_seconds",
        "clients_count",
        "smtp_count",
        "scale_count",
        "workdir",
        "mailman_venv",
        "profile",
        "masd_variant",
        "out",
    ):
        if getattr(a, name) is not None:
            changes[name] = getattr(a, name)
    if a.sessions:
        changes["sessions"] = _ints(a.sessions)
    if a.scale:
        changes["scale"] = _ints(a.scale)
    if a.peers:
        changes["peers"] = _names(a.peers, PEERS)
    if a.sections:
        changes["sections"] = _names(a.sections, SECTIONS)
    if a.keep:
        changes["keep"] = True
    return replace(o, **changes)


def _load() -> str:
    """1, 5 and 15 minute load averages: other work on the machine shows here."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def bench_stores(report: Report) -> None:
    """Intake, outbound and status callbacks on each store, one and two hosts."""
    from bench import stores
    from masd.testing.postgres import find_bindir

    if find_bindir() is None:
        report.notes.append("stores: not measured, PostgreSQL is not installed (postgresql).")
        return
    o = report.options
    mails, statuses = max(40, o.count // 10), max(20, o.count // 20)
    say(f"stores: {mails} mails, {statuses} status callbacks on each")
    report.stores = stores.run(["--mails", str(mails), "--statuses", str(statuses)])


def bench_pgscale(report: Report) -> None:
    """1, 2 and 3 hosts on PostgreSQL behind a 1 ms proxy, fsync off and on, SQLite beside."""
    from bench import pg_scale
    from masd.testing.postgres import find_bindir

    if find_bindir() is None:
        report.notes.append("pgscale: not measured, PostgreSQL is not installed (postgresql).")
        return
    # Rows of a few seconds: their ratios are the targets', and a short row is mostly noise.
    mails = max(10, min(2000, report.options.count * 2 // 5))
    say(f"pgscale: {mails} mails per row")
    report.pgscale = pg_scale.run(["--mails", str(mails)])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    o = parse(args)
    o.workdir.mkdir(parents=True, exist_ok=True)
    report = Report(
        options=o,
        command=shlex.join(["python", "-m", "bench.run", *args]),
        machine=machine(o.workdir),
        started=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
    if o.masd_variant:
        report.machine["masd variant"] = f"{o.masd_variant} (bench/masd_variant.py)"
    report.machine["load average at start"] = _load()
    began = time.monotonic()
    say("masd benchmarks: " + report.command)
    for k, v in report.machine.items():
        say(f"  {k}: {v}")
    steps = {
        "intake": bench_intake,
        "status": bench_status,
        "outbound": bench_outbound,
        "smtp": bench_smtp,
        "scale": bench_scale,
        "stores": bench_stores,
        "pgscale": bench_pgscale,
    }
    for section in SECTIONS:
        if section in o.sections:
            steps[section](report)
    report.seconds = time.monotonic() - began
    report.machine["load average at end"] = _load()
    if (revision := masd_revision()) != report.machine["masd code"]:
        report.notes.append(f"masd's code changed during the run, to: {revision}.")
    text = render(report)
    say("\n" + text)
    if o.out is not None:
        write_out(o.out, text)
        say(f"written to {o.out}")
    (o.workdir / "results.json").write_text(
        json.dumps(
            {
                "command": report.command,
                "machine": report.machine,
                "intake": [row.__dict__ for row in report.intake],
                "status": report.status,
                "outbound": report.outbound,
                "clients": report.clients,
                "smtp": report.smtp,
                "restart": report.restart,
                "scale": report.scale,
                "rss": report.rss,
                "wal": report.wal,
                "notes": report.notes,
            },
            indent=1,
        )
    )
    return 0


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like an error, so every server started so far is stopped."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    _stop_on_sigterm()
    try:
        raise SystemExit(main())
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
