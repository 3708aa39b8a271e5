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
