"""The path production takes: authenticated mail, its acknowledgement mailed through the relay.

Each point sends ``count`` messages with a trusted ``Authentication-Results``
(``dmarc=pass``), each from a sender of its own, over ``sessions`` LMTP
sessions from the Python client (:func:`bench.lmtp_load.latency_run`), which
notes when each message got its ``250``.  masd records each one and queues
its acknowledgement, which its outbox mails (DKIM-signed when the point says
so) to :mod:`bench.mail_sink`, Postfix's smtp-sink noting when each arrives.

Per point: msg/s and LMTP latency as the client saw them; masd's CPU from
the first message until the last acknowledgement arrived, per message; the
acknowledgements' rate, their delay from the ``250`` of the message they
answer to their arrival at the sink (p50, p99), and how long after the last
``250`` the last one arrived.  Checked, or the run stops: every message
answered ``250`` is stored and acknowledged, every mail the outbox marked
sent is at the sink exactly once, and nothing else is.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import masd_setup as masd
from bench.common import PYTHON, BenchError, Server, free_port, percentile, wait_port
from bench.lmtp_load import latency_run

ACK_WAIT = 600.0


@dataclass(frozen=True)
class Relay:
    """bench.mail_sink: where masd's ``server.smtp_relay`` points."""

    server: Server
    arrivals: Path


def start_relay(work: Path) -> Relay:
    port = free_port()
    arrivals = work / "relay-arrivals.tsv"
    arrivals.unlink(missing_ok=True)
    server = Server.spawn(
        "mail-sink",
        [PYTHON, "-m", "bench.mail_sink", str(port), str(arrivals)],
        work / "relay.log",
        port,
    )
    wait_port(port, proc=server.proc)
    return Relay(server, arrivals)


def arrivals(path: Path) -> list[tuple[float, str, str]]:
    """(epoch, Message-ID, In-Reply-To) of every message at the sink, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        at, mid, irt = line.split("\t")
        out.append((float(at), mid, irt))
    return out


def ack_point(
    server: Server,
    setup: masd.MasdSetup,
    relay: Relay,
    *,
    name: str,
    sessions: int,
    count: int,
    size: int,
) -> dict[str, Any]:
    """One point (see the module docstring); raises BenchError when a check fails."""
    server.check_alive()
    before = masd.counts(setup.database)
    seen = len(arrivals(relay.arrivals))
    tag = f"{name.replace('!', '-').replace('+', '-')}-{sessions}"
    rcpt = f"ticket{'!callback' if 'callback' in name else ''}@{masd.DOMAIN}"
    cpu, began = server.cpu(), time.time()
    lat = asyncio.run(
        latency_run(
            setup.lmtp_port, sessions, count, lambda _: rcpt, size=size, tag=tag, authenticated=True
        )
    )
    if lat.accepted != lat.sent:
        raise BenchError(f"{name}: {lat.sent - lat.accepted} of {lat.sent} refused: {lat.replies}")
    until = time.monotonic() + ACK_WAIT
    while len(arrivals(relay.arrivals)) - seen < lat.accepted:
        server.check_alive()
        if time.monotonic() > until:
            got = len(arrivals(relay.arrivals)) - seen
            raise BenchError(f"{name}: {got} of {lat.accepted} acknowledgements in {ACK_WAIT:g} s")
        time.sleep(0.05)
    cpu = server.cpu() - cpu
    mine = arrivals(relay.arrivals)[seen:]
    after = masd.counts(setup.database)
    _check(name, lat.accepted, before, after, mine, lat.accepted_at)
    # A mail reaches the sink before the outbox writes it down as sent.
    until = time.monotonic() + 30
    while (why := _unlike_sent(setup.database, arrivals(relay.arrivals))) is not None:
        if time.monotonic() > until:
            raise BenchError(f"{name}: {why}")
        time.sleep(0.1)
    delays = [at - lat.accepted_at[irt] for at, _, irt in mine]
    last_ack = max(at for at, _, _ in mine)
    return {
        "rate": lat.rate,
        "cpu_ms": 1000 * cpu / lat.accepted,
        "p50_ms": 1000 * percentile(lat.latencies, 50),
        "p99_ms": 1000 * percentile(lat.latencies, 99),
        "latency_rate": lat.rate,
        "stored": f"{lat.accepted:,} of {lat.accepted:,}, each acknowledged once",
        "ack_rate": len(mine) / (last_ack - began),
        "ack_p50_ms": 1000 * percentile(delays, 50),
        "ack_p99_ms": 1000 * percentile(delays, 99),
        "ack_lag_s": last_ack - max(lat.accepted_at.values()),
    }


def _check(
    name: str,
    accepted: int,
    before: dict[str, int],
    after: dict[str, int],
    mine: list[tuple[float, str, str]],
    accepted_at: dict[str, float],
) -> None:
    stored = after["messages"] - before["messages"]
    queued = after["mail"] - before["mail"]
    if stored != accepted or queued != accepted:
        raise BenchError(
            f"{name}: {accepted} answered 250, {stored} stored, {queued} acknowledgements queued"
        )
    answered = Counter(irt for _, _, irt in mine)
    strays = [irt for irt in answered if irt not in accepted_at]
    doubles = [irt for irt, n in answered.items() if n > 1]
    if strays or doubles or len(answered) != accepted:
        raise BenchError(
            f"{name}: acknowledgements for {len(answered)} of {accepted} messages;"
            f" {len(doubles)} answered twice, {len(strays)} answer no message of the point"
        )


def _unlike_sent(database: Path, everything: list[tuple[float, str, str]]) -> str | None:
    """Why the mail marked sent is not exactly what the sink holds, each once; or None."""
    sent = Counter(masd.mail_sent(database))
    arrived = Counter(mid for _, mid, _ in everything)
    if sent == arrived:
        return None
    missing = sum((sent - arrived).values())
    extra = sum((arrived - sent).values())
    return (
        f"{sum(sent.values())} mails marked sent, {sum(arrived.values())} at the sink:"
        f" {missing} marked sent and missing, {extra} at the sink and not marked sent (or twice)"
    )


# --------------------------------------------------------------------------- report

PLAIN, CALLBACK = "masd+ack", "masd!callback+ack"


def _row(rows: list[Any], server: str, sessions: int) -> Any | None:
    return next((r for r in rows if r.server == server and r.sessions == sessions), None)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def render(rows: list[Any], count: int, sessions: tuple[int, ...]) -> list[str]:
    """The production path's table and its ratio rows (markdown lines)."""
    mine = [r for r in rows if r.ack_rate is not None]
    if not mine:
        return []

    def f(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = [
        f"### The production path: authenticated mail, acknowledgement mailed, {count:,} per point",
        "",
        "Each message carries a trusted `Authentication-Results` with `dmarc=pass` and comes from "
        "a sender of its own; masd records it, answers `250` and mails an acknowledgement "
        "through its relay, Postfix's `smtp-sink` (`bench/mail_sink.py` notes each arrival). "
        "`+dkim`: the acknowledgement is signed (RSA 2048). msg/s and LMTP p99: the Python "
        "client (`bench/lmtp_load.py`). CPU: masd's, from the first message until the last "
        "acknowledgement arrived, per message. ack delay: from the `250` of a message to the "
        "arrival of its acknowledgement at the sink. last ack: how long after the last `250` "
        "the last acknowledgement arrived. checked: every message stored and acknowledged "
        "exactly once, and every mail masd marked sent found at the sink exactly once.",
        "",
        "| point | sessions | msg/s | CPU ms/msg | LMTP p99 ms | acks/s | ack delay p50 ms "
        "| ack delay p99 ms | last ack | checked |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in mine:
        lines.append(
            f"| {r.server} | {r.sessions} | {f(r.rate)} | {f(r.cpu_ms, 2)} | {f(r.p99_ms, 1)} "
            f"| {f(r.ack_rate)} | {f(r.ack_p50_ms, 1)} | {f(r.ack_p99_ms, 1)} "
            f"| {f(r.ack_lag_s, 2)} s | {r.stored} |"
        )
    body = []
    for n in sessions:
        plain, call = _row(rows, PLAIN, n), _row(rows, CALLBACK, n)
        bare, bare_call = _row(rows, "masd", n), _row(rows, "masd!callback", n)
        dk, dk_call = _row(rows, PLAIN + "+dkim", n), _row(rows, CALLBACK + "+dkim", n)

        def rate(r: Any | None, attr: str = "rate") -> float | None:
            return None if r is None else getattr(r, attr)

        body.append(
            [
                str(n),
                _ratio(rate(plain), rate(bare, "latency_rate")),
                _ratio(rate(call), rate(bare_call, "latency_rate")),
                _ratio(rate(dk), rate(plain)),
                _ratio(rate(dk_call), rate(call)),
            ]
        )
    lines += [
        "",
        "Ratios of msg/s (the intake-only points' rates here are from the same Python client, "
        "unauthenticated):",
        "",
        "| sessions | masd+ack / masd intake only | masd!callback+ack / masd!callback intake only "
        "| masd+ack+dkim / masd+ack | masd!callback+ack+dkim / masd!callback+ack |",
        "| --- | --- | --- | --- | --- |",
        *["| " + " | ".join(b) + " |" for b in body],
        "",
    ]
    return lines


def targets(rows: list[Any]) -> list[tuple[str, str, str]]:
    """(target, measured, met / missed) for the production path's targets at 8 sessions."""
    out: list[tuple[str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    plain, bare = _row(rows, PLAIN, 8), _row(rows, "masd", 8)
    if plain is not None and bare is not None:
        x = plain.rate / bare.latency_rate
        out.append(
            (
                "authenticated intake with acknowledgement at 8 sessions >= 0.8x intake only",
                f"{plain.rate:,.0f} vs {bare.latency_rate:,.0f} msg/s = {x:.2f}x",
                verdict(x >= 0.8),
            )
        )
    for base in (PLAIN, CALLBACK):
        off, on = _row(rows, base, 8), _row(rows, base + "+dkim", 8)
        if off is not None and on is not None:
            x = on.rate / off.rate
            out.append(
                (
                    f"{base}: DKIM on >= 0.9x DKIM off at 8 sessions",
                    f"{on.rate:,.0f} vs {off.rate:,.0f} msg/s = {x:.2f}x",
                    verdict(x >= 0.9),
                )
            )
    for r in rows:
        if r.ack_rate is not None and r.sessions == 8:
            out.append(
                (
                    f"{r.server}: acknowledgement delay p99 <= 50 ms at 8 sessions",
                    f"p99 {r.ack_p99_ms:,.1f} ms (p50 {r.ack_p50_ms:,.1f} ms)",
                    verdict(r.ack_p99_ms <= 50),
                )
            )
    return out
