"""Removing any single behaviour from masd makes at least one flow fail.

Each case copies ``masd/`` into a temporary folder, removes one behaviour
with a small textual change (the pattern must be found exactly once, so a
refactoring cannot make the test pass vacuously), and runs the conformance
runner against that copy (``--target "<python> -m masd serve"`` with
``PYTHONPATH`` pointing at it; the runner itself is this checkout's masd).
The flows named must report a failure; the same flows pass against masd
itself (``test_conformance_runner.test_master_suite_passes``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MUTANTS = [
    pytest.param(
        # docs/protocol.md §7: "A receiver MUST ignore a status whose seq is not greater
        # than the last one it accepted".
        "masd/core/engine.py",
        "if handoff.last_seq is not None and msg.seq <= handoff.last_seq:",
        "if False:",
        ["stale-seq-ignored"],
        id="ignore-seq",
    ),
    pytest.param(
        # docs/protocol.md §4: "Steering a case needs an authenticated, non-automated sender".
        "masd/core/engine.py",
        "if typ.require_dmarc_for_handoff and not mail.auth.authenticated:",
        "if False:",
        ["blocked-unauthenticated-sender", "untrusted-authentication-results-ignored"],
        id="no-dmarc-for-steering",
    ),
    pytest.param(
        # docs/protocol.md §14: "timed-out: recorded only by the timeout owner ... A mode MUST NOT
        # send it."
        "masd/core/engine.py",
        'MACHINE.check(handoff.status, msg.status, source="mode", timeout_owner=False)',
        'MACHINE.check(handoff.status, msg.status, source="email", timeout_owner=True)',
        ["mode-may-not-send-timed-out"],
        id="mode-may-send-timed-out",
    ),
    pytest.param(
        # docs/protocol.md §7: "A receiver MUST treat a repeated id as already processed".
        "masd/store/idempotency.py",
        '    if kept is not None:\n        return int(kept["status"]), json.loads(kept["body"])',
        "    if False:\n        pass",
        ["idempotent-repeated-id"],
        id="no-idempotency",
    ),
]


def _mutant(tmp_path: Path, file: str, pattern: str, replacement: str) -> Path:
    root = tmp_path / "mutant"
    shutil.copytree(ROOT / "masd", root / "masd", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "conformance").symlink_to(ROOT / "conformance")
    target = root / file
    text = target.read_text()
    assert text.count(pattern) == 1, f"{file}: the pattern to mutate is not there exactly once"
    target.write_text(text.replace(pattern, replacement))
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("file", "pattern", "replacement", "flows"), MUTANTS)
def test_removing_a_behaviour_fails_a_flow(
    tmp_path: Path, file: str, pattern: str, replacement: str, flows: list[str]
) -> None:
    root = _mutant(tmp_path, file, pattern, replacement)
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "masd", "conformance", "run", "--role", "master"]
    for name in flows:
        argv += ["--flow", name]
    argv += ["--target", f"{sys.executable} -m masd serve"]
    proc = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert failed, f"the mutant passed every flow:\n{proc.stdout}"
    # A behaviour was missed, not a process that failed to start.
    assert all(": step " in line for line in failed), proc.stdout
    assert lines[-1] == f"{len(flows) - len(failed)} passed, {len(failed)} failed"
    assert proc.returncode == 1
