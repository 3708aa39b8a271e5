"""``masd demo`` as a user runs it: a real ``python -m masd demo`` process, twice.

Also the stage that orders its lines (:class:`masd.demo.stage.Stage`), on its own.
"""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from masd.cli import main
from masd.demo.stage import Stage

ROOT = Path(__file__).resolve().parent.parent
#: What differs from run to run: ids, ports, times, Message-IDs, the temporary folder.
_VARYING = [
    (re.compile(r"[0-9a-f]{8,}"), "H"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "TIME"),
    (re.compile(r"<[^<>@\s]+@[^<>\s]+>"), "<MID>"),
    (re.compile(r"masd-demo-\w+"), "masd-demo-DIR"),
]
#: An event line: who (blank on a continuation line), a bar, what happened.
_EVENT = re.compile(r"^  ([^|]*?) *\| (.*)$")


@pytest.fixture(scope="module")
def runs() -> list[subprocess.CompletedProcess[str]]:
    return [
        subprocess.run(
            [sys.executable, "-m", "masd", "demo"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        for _ in range(2)
    ]


def _normal(out: str) -> list[str]:
    for pattern, same in _VARYING:
        out = pattern.sub(same, out)
    return out.splitlines()


@pytest.mark.slow
def test_demo_prints_its_lines_in_the_same_order_every_run(
    runs: list[subprocess.CompletedProcess[str]],
) -> None:
    first, second = (_normal(done.stdout) for done in runs)
    assert len(first) > 200
    assert first == second


@pytest.mark.slow
def test_no_line_comes_before_the_act_that_caused_it(
    runs: list[subprocess.CompletedProcess[str]],
) -> None:
    """After each piece of narration, the first event is the demo's own act (an LMTP
    delivery or a peer's post), never what a peer or the relay received."""
    out = runs[0].stdout
    master = out.split("6. Each case's thread", 1)[0]
    slave = out.split("masd as slave:", 1)[1].split("10. What the master", 1)[0]
    runs_of_events: list[list[tuple[str, str]]] = [[]]
    for line in (master + slave).splitlines():
        m = _EVENT.match(line)
        if m is None:
            runs_of_events.append([])
        elif m.group(1):
            runs_of_events[-1].append((m.group(1), m.group(2)))
    firsts = [events[0] for events in runs_of_events if events]
    assert len(firsts) == 10  # five mails, Carol's reply; three mails, Frank's second
    for who, what in firsts:
        assert who == "LMTP", (who, what)
        assert re.match(r"RCPT \S+: 250 ", what), what


def test_demo_help_describes_both_parts() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "Master part" in text
    assert "demo mode endpoint" in text
    assert "Slave part" in text
    assert "demo CRM" in text


@pytest.mark.slow
def test_demo_runs_every_flow_and_prints_each_thread(
    runs: list[subprocess.CompletedProcess[str]],
) -> None:
    done = runs[0]
    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    # Two parts: masd as master, then masd as slave.
    out, slave_part = out.split("masd as slave:", 1)

    # Each of the five cases is shown with its timeline.
    pages = re.findall(r"^ *case (ticket=ticket-\d+@help\.example) ", out, re.MULTILINE)
    assert pages == [f"ticket=ticket-{n}@help.example" for n in range(1, 6)]
    assert len(re.findall(r"^ *thread \(\d+ entries\):$", out, re.MULTILINE)) == 5

    # The callbacks: handed off, completed, and the participant told (twice: with
    # the phone in the first mail, and after negotiating for it).
    assert len(re.findall(r"status +callback \w+ +completed +by mode", out)) == 2
    assert "negotiating  by mode" in out
    assert "handoff.update" in out
    assert "The callback you asked for has been completed." in out
    # chat has no endpoint: refused by email itself.
    assert re.search(r"status +chat \w+ +refused +by email +reason=mode-unavailable", out)
    # The automated sender is never answered: the refused send is on its thread.
    assert re.search(r"mail\.refused +reason=automated-sender +to noreply@shop\.example", out)
    assert "every flow settled" in out

    # The second part: masd as slave, under the demo master.
    assert "case=CRM-" not in out
    slave_pages = re.findall(r"^ *case (case=CRM-\d+@help\.example) ", slave_part, re.MULTILINE)
    assert slave_pages == ["case=CRM-1001@help.example", "case=CRM-1002@help.example"]
    assert len(re.findall(r"^ *thread \(\d+ entries\):$", slave_part, re.MULTILINE)) == 2
    assert re.search(r"posted case\.assign CRM-1001 -> HTTP 200", slave_part)
    assert re.search(r"posted case\.assign CRM-1002 -> HTTP 200", slave_part)
    assert re.search(r"posted case\.policy .*webhook.* for case=CRM-1002@help\.example", slave_part)
    assert (
        len(
            re.findall(
                r"posted mail\.send .* -> HTTP 200 \{\"ok\": true, \"sent\": true\}", slave_part
            )
        )
        == 4
    )
    # What the master received, in order: intakes carry no case yet; a mode under the
    # block policy is not forwarded; every status of the transfer is relayed in order.
    received = slave_part.split("What the master received, in order", 1)[1].split("\n11. ")[0]
    rows = [line.split() for line in received.splitlines() if line.startswith("  ")]
    assert [row[0] for row in rows] == [
        "case.intake",
        "case.message",
        "handoff.requested",
        "case.intake",
        "case.message",
        "handoff.requested",
        "handoff.status",
        "handoff.status",
        "handoff.status",
    ]
    assert rows[2][-2:] == ["chat", "forwarded=false"]
    assert rows[5][-2:] == ["callback", "forwarded=true"]
    assert [row[-2:] for row in rows[6:]] == [
        ["1", "scheduled"],
        ["2", "running"],
        ["3", "completed"],
    ]
    # masd's own record: the transfer went to the webhook, the statuses came from it.
    assert re.search(
        r"contract\.out +handoff\.request .* to webhook:help\.example/case/", slave_part
    )
    assert (
        len(
            re.findall(
                r"contract\.out +handoff\.status .* to master:help\.example/case", slave_part
            )
        )
        == 3
    )
    assert re.search(r"status +callback \w+ +completed +by mode", slave_part)
    # A master's mail.send carries no Auto-Submitted; masd mailed nothing on its own.
    assert "Auto-Submitted" not in slave_part
    assert "(reply)" in slave_part
    assert "every slave flow settled" in slave_part


# --------------------------------------------------------------------------- the stage


def test_effects_are_printed_after_the_act_in_receiver_order() -> None:
    out = io.StringIO()
    stage = Stage(out)
    looks = 0

    async def idle() -> bool:
        nonlocal looks
        looks += 1
        if looks == 1:  # masd is still sending: one more effect comes in
            stage.effect("callback", "got handoff.request")
            return False
        return True

    async def play() -> None:
        stage.idle = idle
        async with stage.act():
            stage.effect("mail out", "From ticket=ticket-1@help.example", "Subject: Re: Hi")
            stage.effect("crm", "got case.message")
            stage.event("LMTP", "RCPT ticket@help.example: 250 2.0.0 recorded")
        stage.effect("crm", "got case.intake")  # no act on: printed at once

    asyncio.run(play())
    assert [line.split("|", 1)[0].strip() or "..." for line in out.getvalue().splitlines()] == [
        "LMTP",
        "crm",
        "callback",
        "mail out",
        "...",
        "crm",
    ]
    assert looks == 2


def test_acts_take_turns() -> None:
    out = io.StringIO()
    stage = Stage(out)
    started = asyncio.Event()

    async def slow() -> None:
        async with stage.act():
            started.set()
            await asyncio.sleep(0)
            stage.effect("callback", "got handoff.update")
            stage.event("LMTP", "first act")

    async def fast() -> None:
        await started.wait()
        async with stage.act():
            stage.event("crm", "posted mail.send")

    async def play() -> None:
        await asyncio.gather(fast(), slow())

    asyncio.run(play())
    assert [line.split("|", 1)[1].strip() for line in out.getvalue().splitlines()] == [
        "first act",
        "got handoff.update",
        "posted mail.send",
    ]
