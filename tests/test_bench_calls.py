"""``python -m bench.calls``: masd really run under cProfile, its calls per mail counted.

No figure is judged (a benchmark's numbers are printed, not asserted); what is
checked is that each build ran on the load, every mail was stored (the run
ends with an error otherwise), and the report names masd's own functions on
the path with their calls per mail beside the other build's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def calls(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.calls", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_both_builds_are_counted_per_mail_by_function(tmp_path: Path) -> None:
    args = ["HEAD", "--paths", "intake", "--small", "5", "--large", "15", "--top", "400"]
    run = calls(*args, "--workdir", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout.splitlines()
    assert out[0] == "== intake: working tree against HEAD", run.stdout
    total = re.fullmatch(r"calls per mail: (\d+) \(the other build: (\d+)\)", out[1])
    assert total is not None, run.stdout
    assert int(total[1]) > 100
    assert int(total[2]) > 100
    # Each mail is handed to masd's DATA handler as often in both builds (a
    # coroutine: once per resumption), the start-up and shut-down cancelled out.
    name = "handle_DATA (masd/edges/lmtp.py)"
    new, old = (json.loads((tmp_path / f"intake-{i}.json").read_text()) for i in (0, 1))
    assert new[name][0] == old[name][0] > 0
    # Listed: the functions whose calls per mail differ, with both builds' counts.
    for line in out[2:]:
        assert re.fullmatch(r" +[+-]\d+\.\d +-?\d+\.\d vs +-?\d+\.\d  \S.*", line), line


def test_an_unknown_path_and_counts_out_of_order_are_refused() -> None:
    run = calls("--paths", "status")
    assert run.returncode == 2
    assert "--paths: status not one of intake, ack" in run.stderr
    run = calls("--small", "700", "--large", "200")
    assert run.returncode == 2
    assert "--small 700 and --large 200: 1 <= small < large" in run.stderr
