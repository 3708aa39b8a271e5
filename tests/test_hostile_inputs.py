"""Inputs that used to reach a traceback, a file of someone else's, or the end of memory.

Huge integers and cursors on the read side (named refusals, not 503), a backup that
never writes into a file made in advance, a doctor that opens the store whatever its
path holds, and ``masd explain`` on a device that never ends (docs/protocol.md §16,
docs/operations.md).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support.http import ADMIN, serving, write_config

from masd.store import backup, migrate, probe

AUTH = {"Authorization": f"Bearer {ADMIN}"}
HUGE = "9" * 5000  # past Python's 4,300 digits of int()
BEYOND_INT64 = str(2**63)  # 19 digits, one more than SQLite's INTEGER holds


def test_huge_integers_and_cursors_are_refused_naming_the_parameter(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            key = "ticket=gs-1@help.example"
            for path, params, name in (
                (f"/mas/v0.1/cases/{key}/thread", {"after": HUGE}, "after"),
                (f"/mas/v0.1/cases/{key}/thread", {"after": BEYOND_INT64}, "after"),
                (f"/mas/v0.1/cases/{key}/thread", {"limit": HUGE}, "limit"),
                ("/mas/v0.1/cases", {"after": "c" + BEYOND_INT64}, "after"),
                ("/mas/v0.1/cases", {"after": "c" + "9" * 19}, "after"),
                ("/mas/v0.1/cases", {"after": "c" + HUGE}, "after"),
                ("/mas/v0.1/cases", {"limit": HUGE}, "limit"),
                ("/mas/v0.1/events", {"limit": HUGE}, "limit"),
                ("/mas/v0.1/events", {"wait": HUGE}, "wait"),
                ("/mas/v0.1/events", {"after": "e" + HUGE}, "after"),
                ("/mas/v0.1/admin/outbox", {"limit": HUGE}, "limit"),
            ):
                response = await run.client.get(path, params=params, headers=AUTH)
                assert response.status_code == 400, (path, params, response.text[:300])
                body = response.json()
                assert body["error"] == "invalid-message"
                assert body["detail"].startswith(f"{name}:"), body["detail"]
                assert len(body["detail"]) < 200
            # Leading zeros are still the number they write.
            zeros = await run.client.get(
                "/mas/v0.1/cases", params={"limit": "0" * 5000 + "5"}, headers=AUTH
            )
            assert zeros.status_code == 200

    asyncio.run(main())


def test_backup_never_writes_into_a_file_made_in_advance(tmp_path: Path) -> None:
    store = tmp_path / "masd.db"
    migrate(store)
    shared = tmp_path / "backups"
    shared.mkdir()
    shared.chmod(0o1777)  # a directory others may write in, as /tmp is
    dest = shared / "masd-backup.db"
    # What another local user could make beforehand, under the name a backup took.
    planted = shared / f".{dest.name}.{os.getpid()}.tmp"
    planted.write_bytes(b"")
    planted.chmod(0o666)
    planted_inode = planted.stat().st_ino

    backup(store, dest)

    assert planted.exists()  # left alone, not renamed into place
    assert planted.stat().st_ino == planted_inode
    assert planted.read_bytes() == b""
    st = dest.stat()
    assert st.st_ino != planted_inode
    assert st.st_mode & 0o777 == 0o600
    assert st.st_uid == store.stat().st_uid
    with sqlite3.connect(dest) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # Nothing else is left beside it.
    assert sorted(p.name for p in shared.iterdir()) == sorted([dest.name, planted.name])


def test_doctor_opens_the_store_whatever_its_path_holds(tmp_path: Path) -> None:
    folder = tmp_path / "a#b?c%41"
    folder.mkdir()
    store = folder / "masd.db"
    migrate(store)
    probe.check_writable(store)
    assert probe.recent_messages(store, 5) == []
    # No other file was opened (and so created) in its place.
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


def _explain(config: Path, *args: str, stdin: object = None) -> subprocess.CompletedProcess[str]:
    def bounded() -> None:  # a read without end fails here, not on the machine
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "masd", "explain", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=stdin,  # type: ignore[arg-type]
        preexec_fn=bounded,
        check=False,
    )


@pytest.mark.slow
def test_explain_refuses_what_is_not_a_file_and_reads_at_most_the_size_limit(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path)
    zero = _explain(config, "--rcpt", "ticket@help.example", "/dev/zero")
    assert zero.returncode == 2, zero.stderr[-500:]
    assert "/dev/zero: not a regular file (a character device)" in zero.stderr
    assert "Traceback" not in zero.stderr
    folder = _explain(config, str(tmp_path))
    assert folder.returncode == 2
    assert "not a regular file (a directory)" in folder.stderr
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    piped = _explain(config, str(fifo))  # refused, not waited on for a writer
    assert piped.returncode == 2
    assert "not a regular file (a pipe)" in piped.stderr
    # Standard input is read as far as server.max_message_bytes, and no further.
    with open("/dev/zero", "rb") as endless:
        stdin = _explain(config, "--rcpt", "ticket@help.example", "-", stdin=endless)
    assert stdin.returncode == 0, stdin.stderr[-500:]
    assert "max_message_bytes" in stdin.stdout
