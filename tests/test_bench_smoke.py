"""The benchmarks still run: ``python -m bench.run --smoke`` end to end, with tiny counts.

Benchmarks are not tests, so nothing here looks at a time or a rate.  What is
checked is that every part ran against every server, and that the run's own
checks of durability held: a message answered ``250`` and missing from the
store, a status answered ``200`` and not recorded, or an outbox row marked
done that the sink never received ends the run with an error.

Needs Postfix's smtp-source and smtp-sink, wrk and Dovecot's LMTP
(``.ci/setup.d/bench.sh`` installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.system import require_program

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = (1, 8)  # Options.smoke()
COUNT, LATENCY_COUNT = 200, 100  # per point: smtp-source, then the latency pass

pytestmark = [pytest.mark.system, pytest.mark.slow]


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Dovecot delivers as nobody: its Maildir must sit below directories that
    # anyone may traverse, which pytest's tmp_path (mode 0700) is not.
    path = Path(tempfile.mkdtemp(prefix="masd-bench-smoke-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_smoke_run_measures_every_part_and_loses_nothing(workdir: Path) -> None:
    for program in ("smtp-source", "smtp-sink", "wrk", "dovecot"):
        require_program(program)
    production = ["masd+ack", "masd+ack+dkim", "masd!callback+ack", "masd!callback+ack+dkim"]
    servers = [*production, "masd", "masd!callback", "aiosmtpd-discard", "smtp-sink"]
    peers = "masd-ack,masd-ack-dkim,masd-callback-ack,masd-callback-ack-dkim"
    peers += ",masd,masd-callback,aiosmtpd,smtp-sink"
    if os.geteuid() == 0:  # Dovecot's master must start as root
        servers.append("dovecot-lmtp")
        peers += ",dovecot"
    out = workdir / "performance.md"
    out.write_text("# kept above\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n\nkept below\n")

    argv = ["--smoke", "--peers", peers, "--workdir", str(workdir / "w"), "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    results = json.loads((workdir / "w" / "results.json").read_text())
    intake = {(row["server"], row["sessions"]): row for row in results["intake"]}
    assert set(intake) == {(s, n) for s in servers for n in SESSIONS}
    for (server, _), row in intake.items():
        assert row["rate"] > 0
        if server in production:
            # Every message stored and acknowledged once, every mail marked sent at the sink.
            assert row["stored"] == f"{COUNT} of {COUNT}, each acknowledged once", row
            assert row["ack_rate"] > 0
            assert row["ack_p50_ms"] <= row["ack_p99_ms"]
        elif server.startswith("masd") or server == "dovecot-lmtp":
            total = COUNT + LATENCY_COUNT
            assert row["stored"] == f"{total} of {total}", row

    # handoff.request from every !callback mail reached the sink.
    assert [e["sessions"] for e in results["outbound"]] == list(SESSIONS)
    assert sum(e["queued"] for e in results["outbound"]) == len(SESSIONS) * (COUNT + LATENCY_COUNT)

    status = {(row["target"], row["connections"]): row for row in results["status"]}
    assert set(status) == {(t, c) for t in ("masd", "bare aiohttp (JSON only)") for c in (1, 16)}
    for connections in (1, 16):
        row = status[("masd", connections)]
        assert row["non2xx"] == row["errors"] == 0
        assert row["requests"] <= row["recorded"] <= row["requests"] + connections

    restart = results["restart"]
    assert restart["rows"] == 500
    assert 0 < restart["done"] <= restart["delivered"]
    assert {(c["client"], c["concurrency"]) for c in results["clients"]} >= {
        ("httpx", 16),
        ("aiohttp", 16),
    }
    assert [s["cases"] for s in results["scale"]] == [200, 2000]
    assert all(s["stored"] == 200 for s in results["scale"])

    # Every masd the run started stopped with exit 0 on SIGTERM (its store closed).
    assert [n for n in results["notes"] if "on SIGTERM" in n] == []

    text = out.read_text()
    assert text.startswith("# kept above\n")
    assert text.endswith("kept below\n")
    assert "\nold\n" not in text
    for heading in (
        "The production path",
        "LMTP intake only",
        "Status callbacks",
        "Restart with",
        "Scale",
        "Targets",
    ):
        assert f"### {heading}" in text
    assert "python -m bench.run --smoke" in text
