"""``masd demo`` as a user runs it: a real ``python -m masd demo`` process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_every_flow_and_prints_each_thread() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "masd", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
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
