"""Kill a writer process mid-batch with SIGKILL; every job must be all-or-nothing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from masd.store import Store

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "store_crash_child.py"
DOMAIN = "crash.example"


def run_and_kill(db: Path, kill_after: int) -> set[int]:
    """Start the child, wait for ``kill_after`` committed jobs, SIGKILL it.

    Returns the case numbers the child reported as committed.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # Safety net only: a child that never reports is killed so the test fails
    # instead of hanging.
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    committed: set[int] = set()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        while len(committed) < kill_after:
            line = proc.stdout.readline()
            assert line, f"child ended early: {proc.stderr.read() if proc.stderr else ''}"
            word, n = line.split()
            assert word == "committed"
            committed.add(int(n))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return committed


def check_consistent(db: Path, committed: set[int]) -> int:
    """Integrity, all-or-nothing jobs, and every reported commit present."""
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        cases = {
            int(i.removeprefix("t-")): (key, seq)
            for key, i, seq in conn.execute("SELECT key, id, thread_seq FROM cases")
        }
        thread = {
            key: (seq, kind, data)
            for key, seq, kind, data in conn.execute("SELECT case_key, seq, kind, data FROM thread")
        }
        messages = {
            key: ref for key, ref in conn.execute("SELECT case_key, message_ref FROM messages")
        }
        (next_n,) = conn.execute(
            "SELECT next_n FROM id_counters WHERE domain = ? AND type = 'ticket'", (DOMAIN,)
        ).fetchone()
    finally:
        conn.close()
    # Every job is whole: a case, its one thread entry and its message, or none of them.
    assert len(thread) == len(messages) == len(cases)
    for n, (key, thread_seq) in cases.items():
        assert thread_seq == 1
        assert thread[key] == (1, "mail.in", f'{{"message_ref":"m-{n}"}}')
        assert messages[key] == f"m-{n}"
    # The counter moved with the cases: numbers 1..N, no gap, none ahead.
    assert sorted(cases) == list(range(1, next_n))
    # What the child was told is committed survived the kill.
    assert committed <= set(cases)
    return len(cases)


@pytest.mark.slow
@pytest.mark.parametrize("kill_points", [(1, 40, 400, 2000)])
def test_sigkill_mid_batch_keeps_jobs_whole(tmp_path: Path, kill_points: tuple[int, ...]) -> None:
    db = tmp_path / "crash.db"
    total_reported: set[int] = set()
    previous = 0
    for kill_after in kill_points:
        committed = run_and_kill(db, kill_after)
        total_reported |= committed
        count = check_consistent(db, total_reported)
        assert count >= previous + kill_after
        previous = count
    # The store opens and writes normally after the last crash.
    with Store.open(db) as store:
        assert (
            store.read_sync(lambda d: d.execute("SELECT count(*) FROM cases").fetchone()[0])
            == previous
        )
