"""The bounce reader (masd/edges/bounce_reader.py): bounces read in a real child process,
within a time budget, a bounded queue in front of it, and a child that dies replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
from support.bounces import postfix_dsn

from masd.edges.bounce_reader import BounceReader, Busy
from masd.metrics import Metrics
from masd.service import bounce_mail

ANN = "ann@example.org"
TO = "ticket=ticket-1+bounce-1-abc@help.example"


def hostile(lines: int = 40_000) -> bytes:
    """A mail of short lines, each costing the detectors of non-standard bounces dearly."""
    head = b"From: MAILER-DAEMON@mx.example\r\nSubject: Undelivered\r\n\r\n"
    return head + b"x\r\n" * lines


#: A real child that reads as masd's does, except that a mail with STALL in it never
#: gets an answer: whatever this machine's speed, that mail outlasts any budget.
STALL = b"X-Test-Stall: yes"
STALLING_CHILD = (
    sys.executable,
    "-c",
    "import time\n"
    "import masd.edges.bounce_reader as reader\n"
    "real = reader.read_bounce\n"
    "def read(raw):\n"
    f"    if {STALL!r} in raw:\n"
    "        time.sleep(3600)\n"
    "    return real(raw)\n"
    "reader.read_bounce = read\n"
    "reader.main()\n",
)


def stalled() -> bytes:
    return STALL + b"\r\n" + hostile(10)


def outcomes(metrics: Metrics) -> dict[str, float]:
    kinds = ("bounce", "no-bounce", "over-budget", "busy")
    return {k: metrics.value("masd_bounce_reads_total", outcome=k) for k in kinds}


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_report_is_read_in_the_child_and_the_child_ends_on_close() -> None:
    async def main() -> None:
        metrics = Metrics()
        reader = BounceReader(metrics)
        read = await reader.read(postfix_dsn(TO, ANN))
        assert read.unread is None
        assert read.report is not None
        assert (read.report.recipient, read.report.status) == (ANN, "5.1.1")
        assert read.report.remote_mta == "mx.example.net"
        plain = await reader.read(b"Subject: hello\r\n\r\nJust a note.\r\n")
        assert plain == bounce_mail.Read(None)
        child = reader._child
        assert child is not None
        assert child.pid != os.getpid()
        await reader.close()
        assert child.returncode == 0
        assert outcomes(metrics) == {
            "bounce": 1.0,
            "no-bounce": 1.0,
            "over-budget": 0.0,
            "busy": 0.0,
        }

    run(main())


@pytest.mark.slow
def test_a_mail_over_the_budget_is_read_as_no_bounce_and_the_next_gets_a_new_child() -> None:
    async def main() -> None:
        metrics = Metrics()
        reader = BounceReader(metrics, budget=0.3, command=STALLING_CHILD)
        await reader.read(b"Subject: warm\r\n\r\nstart the child\r\n")
        first = reader._child
        assert first is not None
        read = await reader.read(stalled())
        assert read == bounce_mail.Read(None, unread=bounce_mail.OVER_BUDGET)
        assert first.returncode == -signal.SIGKILL
        after = await reader.read(postfix_dsn(TO, ANN))
        assert after.report is not None
        assert after.report.recipient == ANN
        assert reader._child is not None
        assert reader._child.pid != first.pid
        assert outcomes(metrics)["over-budget"] == 1.0
        await reader.close()

    run(main())


@pytest.mark.slow
def test_past_the_waiting_bound_a_mail_is_busy() -> None:
    async def main() -> None:
        metrics = Metrics()
        reader = BounceReader(metrics, budget=1, max_waiting=1, command=STALLING_CHILD)
        await reader.read(b"Subject: warm\r\n\r\nstart the child\r\n")
        reading = asyncio.create_task(reader.read(stalled()))
        await asyncio.sleep(0.05)  # the first has its turn
        waiting = asyncio.create_task(reader.read(postfix_dsn(TO, ANN)))
        await asyncio.sleep(0.05)  # the second waits
        with pytest.raises(Busy, match="1 mails wait"):
            await reader.read(postfix_dsn(TO, ANN))
        assert (await reading).report is None
        later = await waiting  # the one that waited is read in its turn
        assert later.report is not None
        assert outcomes(metrics)["busy"] == 1.0
        await reader.close()

    run(main())


@pytest.mark.slow
def test_a_mail_that_waits_too_long_for_its_turn_is_busy() -> None:
    async def main() -> None:
        reader = BounceReader(budget=1, wait=0.2, command=STALLING_CHILD)
        await reader.read(b"Subject: warm\r\n\r\nstart the child\r\n")
        reading = asyncio.create_task(reader.read(stalled()))
        await asyncio.sleep(0.05)
        with pytest.raises(Busy, match=r"busy for 0\.2 s"):
            await reader.read(postfix_dsn(TO, ANN))
        await reading
        await reader.close()

    run(main())


def test_a_child_killed_between_two_mails_is_replaced() -> None:
    async def main() -> None:
        reader = BounceReader()
        await reader.read(b"Subject: warm\r\n\r\nstart the child\r\n")
        child = reader._child
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
        read = await reader.read(postfix_dsn(TO, ANN))
        assert read.report is not None
        assert read.report.recipient == ANN
        assert reader._child is not None
        assert reader._child.pid != child.pid
        await reader.close()

    run(main())
