"""The outbox under faults it does not cause (docs/protocol.md §10 "Isolation", "never a storm").

Real pieces: FakePeers and an SmtpSink on loopback, a real SQLite store,
mail recorded as the LMTP edge records it.  Each test prints its counts.
"""

from __future__ import annotations

import asyncio
import email
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from support.bounces import bounce_case
from support.outbox import Env, deliver, eventually, inbound, query, run_env

from masd.edges.context import EdgeContext
from masd.edges.lanes import FAILURES_TO_OPEN
from masd.edges.outbox import PEER_IN_FLIGHT, RELAY_IN_FLIGHT, Outbox
from masd.testing import FakePeer, Recorded

pytestmark = [pytest.mark.fault, pytest.mark.slow]

#: docs/protocol.md §10: "a healthy peer's messages and the acknowledgements still leave
#: within 1 s of being recorded".
BOUND = 1.0


def key_of(rec: Recorded) -> str:
    assert isinstance(rec.json, dict)
    return str(rec.json["case"]["key"])


class Arrivals:
    """When each case's acknowledgement reached the relay and each request its peer."""

    def __init__(self) -> None:
        self.recorded: dict[str, float] = {}  # case key -> when its mail was committed
        self.contract: dict[str, float] = {}
        self.mail: dict[str, float] = {}

    def peer_saw(self, rec: Recorded) -> None:
        self.contract.setdefault(key_of(rec), time.monotonic())

    async def watch_sink(self, env: Env) -> None:
        seen = 0
        while True:
            mails = await env.sink.wait_for(seen + 1, timeout=3600)
            now = time.monotonic()
            for mail in mails[seen:]:
                self.mail.setdefault(bounce_case(mail.mail_from), now)  # its case
            seen = len(mails)

    def delays(self, arrived: dict[str, float], keys: list[str]) -> list[float]:
        """Seconds from recording to arrival; a message that never left counts as infinite."""
        return [arrived.get(k, float("inf")) - self.recorded[k] for k in keys]


def p99(delays: list[float]) -> float:
    return sorted(delays)[max(0, round(0.99 * len(delays)) - 1)]


def summary(what: str, delays: list[float]) -> str:
    sent = sum(1 for d in delays if d != float("inf"))
    return (
        f"{what}: {sent}/{len(delays)} left, delay p50 {statistics.median(delays):.3f} s,"
        f" p99 {p99(delays):.3f} s"
    )


async def record_cases(
    env: Env, outbox: Outbox, arrivals: Arrivals, modes: list[str]
) -> dict[str, list[str]]:
    """One new case per entry of ``modes`` (each a ``!MODE`` request), one after another;
    each commit wakes the outbox, as the LMTP edge's commit does."""
    keys: dict[str, list[str]] = {}
    for n, mode in enumerate(modes):
        sender = f"user{n}@example.com"  # the send cap counts per recipient
        rcpt = f"ticket!{mode}@help.example"
        delivered = await deliver(env, rcpt, inbound(rcpt, sender=sender)[0], sender=sender)
        assert delivered.case_key is not None
        arrivals.recorded[delivered.case_key] = time.monotonic()
        outbox.wake()
        keys.setdefault(mode, []).append(delivered.case_key)
    return keys


def test_a_hung_peer_does_not_delay_a_healthy_peer_or_the_mail(tmp_path: Path) -> None:
    """300 cases handed to a mode endpoint that never answers, beside a healthy one."""
    release = asyncio.Event()
    arrivals = Arrivals()

    async def hang(rec: Recorded) -> tuple[int, Any]:
        await release.wait()
        return 200, {"ok": True}

    def healthy(rec: Recorded) -> tuple[int, Any]:
        arrivals.peer_saw(rec)
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        # A timeout longer than the test: every request to the hung peer stays in flight.
        outbox = Outbox(
            EdgeContext(env.rt, env.store, env.clock, env.metrics), http_timeout=120, stop_grace=0.5
        )
        outbox.start()
        watcher = asyncio.create_task(arrivals.watch_sink(env))
        try:
            modes = ["chat" if n % 6 == 5 else "callback" for n in range(360)]
            keys = await record_cases(env, outbox, arrivals, modes)
            assert len(keys["callback"]) == 300
            everything = keys["callback"] + keys["chat"]
            await asyncio.sleep(3.0)  # what has not left by now counts as never sent
            hung_requests = len(env.peer.requests)
        finally:
            await outbox.stop()
            release.set()
            watcher.cancel()
        healthy_delays = arrivals.delays(arrivals.contract, keys["chat"])
        mail_delays = arrivals.delays(arrivals.mail, everything)
        print(
            f"\nhung peer: {hung_requests} requests in flight (limit {PEER_IN_FLIGHT}),"
            f" 300 cases handed to it"
        )
        print(summary("healthy peer's handoff.request", healthy_delays))
        print(summary("acknowledgements", mail_delays))
        assert p99(healthy_delays) <= BOUND
        assert p99(mail_delays) <= BOUND
        assert hung_requests == PEER_IN_FLIGHT  # the hung peer holds its own slots, no more
        rows = await query(env, "SELECT peer, state FROM outbox WHERE kind = 'contract'")
        pending = [r for r in rows if r["state"] == "pending"]
        assert len(pending) == 300  # the hung peer's messages wait; none is lost or failed

    run_env(tmp_path, body, peer=FakePeer(hang), more_peers={"chat": FakePeer(healthy)})


def test_a_peer_failing_forever_opens_its_circuit_and_holds_up_nobody(tmp_path: Path) -> None:
    arrivals = Arrivals()

    def healthy(rec: Recorded) -> tuple[int, Any]:
        arrivals.peer_saw(rec)
        return 200, {"ok": True}

    async def body(env: Env) -> None:
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), stop_grace=0.5)
        outbox.start()
        watcher = asyncio.create_task(arrivals.watch_sink(env))
        began = time.monotonic()
        try:
            modes = ["chat" if n % 4 == 3 else "callback" for n in range(160)]
            keys = await record_cases(env, outbox, arrivals, modes)
            everything = keys["callback"] + keys["chat"]
            await eventually(
                lambda: (
                    len(arrivals.mail) == len(everything)
                    and len(arrivals.contract) == len(keys["chat"])
                ),
                "the healthy peer's messages and every acknowledgement",
                timeout=30,
            )
            await asyncio.sleep(max(0.0, 6.0 - (time.monotonic() - began)))
        finally:
            await outbox.stop()
            watcher.cancel()
        seconds = time.monotonic() - began
        failing = env.peer.url.rstrip("/")
        opened = env.metrics.value("masd_outbox_circuit_total", peer=failing, event="opened")
        reopened = env.metrics.value("masd_outbox_circuit_total", peer=failing, event="reopened")
        failing_requests = len(env.peer.requests)
        healthy_delays = arrivals.delays(arrivals.contract, keys["chat"])
        mail_delays = arrivals.delays(arrivals.mail, everything)
        print(
            f"\nfailing peer: {len(keys['callback'])} cases, {failing_requests} requests in"
            f" {seconds:.1f} s; circuit opened {opened:g}, probed and reopened {reopened:g}"
        )
        print(summary("healthy peer's handoff.request", healthy_delays))
        print(summary("acknowledgements", mail_delays))
        # Before it opened: at most the in-flight limit plus the failures that opened it;
        # then one probe per cool-down (0.5, 1, 2, 4 s at least: under 5 in 6-10 s).
        assert failing_requests <= PEER_IN_FLIGHT + FAILURES_TO_OPEN + 5
        assert opened == 1
        assert reopened >= 1  # it was probed, and stays open
        assert p99(healthy_delays) <= BOUND
        assert p99(mail_delays) <= BOUND
        rows = await query(
            env, "SELECT state FROM outbox WHERE kind = 'contract' AND peer LIKE 'mode:%/callback'"
        )
        assert {r["state"] for r in rows} == {"pending"}  # retried later, not given up
        assert len(rows) == len(keys["callback"])

    run_env(
        tmp_path,
        body,
        peer=FakePeer(lambda rec: (503, {"ok": False})),
        more_peers={"chat": FakePeer(healthy)},
    )


# -- the store refuses writes while sends succeed ----------------------------------------

#: Every write to the outbox fails as on a full disk: the transaction is lost.
REFUSE = (
    "CREATE TEMP TRIGGER refuse_{op} BEFORE {op} ON main.outbox "
    "BEGIN SELECT RAISE(ROLLBACK, 'database or disk is full'); END"
)


async def refuse_writes(env: Env) -> None:
    def install(db: Any) -> None:
        for op in ("UPDATE", "INSERT", "DELETE"):
            db.execute(REFUSE.format(op=op))

    await env.store.write(install)


async def accept_writes(env: Env) -> None:
    def drop(db: Any) -> None:
        for op in ("UPDATE", "INSERT", "DELETE"):
            db.execute(f"DROP TRIGGER IF EXISTS temp.refuse_{op}")

    async def dropped() -> bool:
        try:
            await env.store.write(drop)  # may share a transaction the trigger throws away
        except Exception:
            return False
        return True

    await eventually(dropped, "the fault lifted")


def sends_of(env: Env) -> dict[str, int]:
    """How often each message reached its peer or the relay (by id and Message-ID)."""
    counts: dict[str, int] = {}
    for rec in env.peer.requests:
        assert isinstance(rec.json, dict)
        counts[rec.json["id"]] = counts.get(rec.json["id"], 0) + 1
    for mail in env.sink.messages:
        mid = str(email.message_from_bytes(mail.raw)["Message-ID"])
        counts[mid] = counts.get(mid, 0) + 1
    return counts


def test_no_resend_storm_while_the_store_refuses_writes(tmp_path: Path) -> None:
    """Sends succeed, recording them fails: nothing goes out more than twice (docs/protocol.md §10),
    here across a restart in the middle of the fault."""
    cases = 24
    mails_per_outbox = min(cases, RELAY_IN_FLIGHT)  # the relay's lane stops when it is full

    async def body(env: Env) -> None:
        for n in range(cases):
            sender = f"user{n}@example.com"
            rcpt = "ticket!callback@help.example"
            await deliver(env, rcpt, inbound(rcpt, sender=sender)[0], sender=sender)
        await refuse_writes(env)
        failed_jobs = env.store.stats.failed_jobs
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), stop_grace=2.0)
        outbox.start()
        await env.peer.wait_for(cases)
        await env.sink.wait_for(mails_per_outbox)
        await asyncio.sleep(3.0)  # the fault goes on
        await outbox.stop()  # a restart during the fault: kept outcomes are lost
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), stop_grace=2.0)
        outbox.start()
        await env.peer.wait_for(2 * cases)
        await env.sink.wait_for(2 * mails_per_outbox)
        await asyncio.sleep(2.0)
        during = sends_of(env)
        record_failures = env.store.stats.failed_jobs - failed_jobs
        await accept_writes(env)

        async def all_done() -> bool:
            rows = await query(env, "SELECT state FROM outbox")
            return len(rows) == 2 * cases and all(r["state"] == "done" for r in rows)

        await eventually(all_done, "every outcome recorded once the store takes writes", 60)
        await outbox.stop()
        counts = sends_of(env)
        sent = sum(counts.values())
        repeated = sum(n - 1 for n in counts.values())
        print(
            f"\nstore refusing writes: {2 * cases} messages, {sum(during.values())} sends during"
            f" the fault (one restart), {record_failures} refused store jobs;"
            f" then sent {sent}, recorded {2 * cases}, repeated {repeated},"
            f" most sends of one message {max(counts.values())}"
        )
        assert len(counts) == 2 * cases  # every message went out
        assert max(counts.values()) <= 2
        assert max(during.values()) <= 2

    run_env(tmp_path, body)


def test_a_failure_to_record_backs_off_and_never_loops(tmp_path: Path) -> None:
    """One outcome the store refuses for 4 s is tried a handful of times, not in a loop."""

    async def body(env: Env) -> None:
        rcpt = "ticket@help.example"
        await deliver(env, rcpt, inbound(rcpt)[0])
        await refuse_writes(env)
        before = env.store.stats.failed_jobs
        outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics), stop_grace=2.0)
        outbox.start()
        await env.sink.wait_for(1)
        await asyncio.sleep(4.0)
        tries = env.store.stats.failed_jobs - before
        await accept_writes(env)
        await eventually(
            lambda: env.metrics.value("masd_outbox_attempts_total", kind="mail", result="done"),
            "the outcome recorded",
            30,
        )
        await outbox.stop()
        print(f"\none mail, 4 s of refused writes: {tries} record tries, 1 send")
        assert len(env.sink.messages) == 1
        # Backoff from 1 s with jitter: tries at 0, 0.5-1, 1.5-3, 3.5-7 s.
        assert 2 <= tries <= 4
        assert env.metrics.value("masd_outbox_record_failures_total", kind="mail") == tries
        [row] = await query(env, "SELECT state, attempts FROM outbox")
        assert (row["state"], row["attempts"]) == ("done", 1)

    run_env(tmp_path, body)
