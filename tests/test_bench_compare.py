"""``python -m bench.compare``: an older commit beside the working tree, both really run.

Benchmarks are not tests, so no figure is judged here; what is checked is that
both builds ran (each from its own tree), took turns, every mail was stored
and every acknowledgement arrived (the run ends with an error otherwise), and
the summary names both with their ratio.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.compare", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_an_older_commit_runs_from_its_own_tree_beside_the_working_tree(tmp_path: Path) -> None:
    run = compare(
        "HEAD", "--count", "20", "--rounds", "2", "--sessions", "2", "--workdir", str(tmp_path)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert f"HEAD: masd from {tmp_path}/build-{sha[:12]}/masd/__init__.py" in out, out
    assert f"working tree: masd from {ROOT}/masd/__init__.py" in out, out
    rounds = [line.split()[:4] for line in out.splitlines() if line.startswith("  round")]
    # Round 1 runs the working tree first, round 2 the older build first, on each path.
    assert rounds == [
        ["round", "1", "intake", "working"],
        ["round", "1", "intake", "HEAD"],
        ["round", "1", "ack", "working"],
        ["round", "1", "ack", "HEAD"],
        ["round", "2", "intake", "HEAD"],
        ["round", "2", "intake", "working"],
        ["round", "2", "ack", "HEAD"],
        ["round", "2", "ack", "working"],
    ], out
    ratios = [line for line in out.splitlines() if " ratio " in line]
    assert [r.split()[0] for r in ratios] == ["intake", "ack"], out
    # Each ratio names the range of the two rounds' own ratios.
    assert all(re.search(r"each round \d+\.\d\d-\d+\.\d\dx\)$", r) for r in ratios), out


def test_a_name_that_is_no_commit_is_refused_by_name(tmp_path: Path) -> None:
    run = compare("no-such-rev", "--workdir", str(tmp_path))
    assert run.returncode == 1
    assert "bench.compare: 'no-such-rev' is not a commit of" in run.stdout
    assert "Traceback" not in run.stderr


def test_an_unknown_path_is_refused_with_the_known_ones() -> None:
    run = compare("HEAD", "--paths", "intake,status")
    assert run.returncode == 2
    assert "--paths: status not one of intake, ack" in run.stderr


def test_instructions_are_counted_under_callgrind_for_the_measured_pass_only(
    tmp_path: Path,
) -> None:
    if shutil.which("valgrind") is None:
        if os.environ.get("MASD_REQUIRE_SYSTEM_TESTS"):
            pytest.fail("valgrind is not installed (.ci/setup.d/bench.sh installs it)")
        pytest.skip("valgrind is not installed (Debian's package valgrind)")
    args = ["--count", "20", "--rounds", "1", "--sessions", "2", "--paths", "intake"]
    run = compare("HEAD", "--instructions", *args, "--workdir", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    pattern = r"round 1 intake (working tree|HEAD)\s+([\d.]+) k instructions/mail"
    counted = re.findall(pattern, run.stdout)
    assert sorted(name for name, _ in counted) == ["HEAD", "working tree"], run.stdout
    # A mail is some thousands of thousands of instructions: the counter ran, and not from
    # masd's start (its imports alone are several hundred million).
    assert all(300 < float(k) < 30_000 for _, k in counted), run.stdout
    assert re.search(r"intake  ratio\s+[\d.]+x", run.stdout), run.stdout


def test_instructions_and_a_profile_are_refused_together() -> None:
    run = compare("HEAD", "--instructions", "--profile", "/tmp/x")
    assert run.returncode == 2
    assert "--instructions and --profile" in run.stderr
