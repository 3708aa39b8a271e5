"""The store when it cannot commit: every caller told, recovery by itself, no restart.

Faults are caused for real where the test may: a read-only file (``chmod``,
or a tmpfs remounted read-only when running as root, where file modes do not
stop anyone).  A full disk is injected through the store's seam here
(:class:`support.faults.DiskFull`); tests/test_fault_disk.py fills a real
tmpfs.  Waits are bounded polls; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.faults import IS_ROOT, DiskFull, open_with_seam, remount, tmpfs

from masd.store import Store, StoreError

pytestmark = pytest.mark.fault

WAIT = 15.0


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    DiskFull.armed.clear()
    yield
    DiskFull.armed.clear()


def insert(n: int) -> Callable[[Any], int]:
    def job(tx: Any) -> int:
        return int(
            tx.execute("INSERT INTO id_counters VALUES (?, 'ticket', 1)", (f"d{n}",)).rowcount
        )

    return job


def counters(tx: Any) -> int:
    return int(tx.execute("SELECT count(*) FROM id_counters").fetchone()[0])


def wait_writable(store: Store) -> float:
    """Seconds until the store says it accepts writes again, with no write from here."""
    began = time.monotonic()
    while not store.health.writable:
        assert time.monotonic() - began < WAIT, f"still unwritable: {store.health.describe()}"
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.slow
def test_a_full_disk_fails_every_write_then_heals_by_itself(tmp_path: Path) -> None:
    with open_with_seam(tmp_path / "masd.db") as store:
        assert store.write_sync(insert(0)) == 1
        assert store.health.writable
        DiskFull.armed.set()
        refused = 0
        for n in range(1, 6):
            with pytest.raises(StoreError, match=r"database or disk is full \(SQLITE_FULL\)"):
                store.write_sync(insert(n))
            refused += 1
        health = store.health
        assert not health.writable
        assert "SQLITE_FULL" in health.describe()
        assert store.read_sync(counters) == 1  # reads go on: the last commit is there
        time.sleep(1.5)  # the writer probes meanwhile, on its own
        assert not store.health.writable
        DiskFull.armed.clear()
        healed = wait_writable(store)
        for n in range(1, 6):
            assert store.write_sync(insert(n)) == 1
        assert store.read_sync(counters) == 6
        stats = store.stats
        print(
            f"\nfull disk (injected): {refused} writes refused, writable again {healed:.2f} s"
            f" after the disk was freed, {stats.faults} fault, {stats.failed_batches} failed"
            f" transactions"
        )
        assert stats.faults == 1


@pytest.mark.slow
def test_healthz_check_probes_only_a_verdict_older_than_asked(tmp_path: Path) -> None:
    async def main(store: Store) -> None:
        before = store.stats.batches
        assert (await store.check(max_age=60)).writable  # fresh: no write
        assert store.stats.batches == before
        assert (await store.check(max_age=0)).writable  # stale: one small write
        assert store.stats.batches == before + 1
        DiskFull.armed.set()
        health = await store.check(max_age=0)
        assert not health.writable
        assert "SQLITE_FULL" in health.detail
        DiskFull.armed.clear()

    with open_with_seam(tmp_path / "masd.db") as store:
        store.write_sync(insert(0))  # a verdict: it committed
        asyncio.run(main(store))
        wait_writable(store)


def test_a_jobs_own_error_says_nothing_of_the_store(tmp_path: Path) -> None:
    with Store.open(tmp_path / "masd.db") as store:
        store.write_sync(insert(1))
        with pytest.raises(StoreError, match="UNIQUE constraint failed"):
            store.write_sync(insert(1))
        with pytest.raises(ZeroDivisionError):
            store.write_sync(lambda tx: 1 // 0)
        assert store.health.writable
        assert store.stats.faults == 0


# --------------------------------------------------------------------------- read-only


def crashed_store(path: Path) -> None:
    """A store as a process killed with -9 leaves it: with its -wal and -shm files
    (without them SQLite cannot open a WAL database on a read-only file system)."""
    code = (
        "import os, sys\n"
        "from masd.store import Store\n"
        "store = Store.open(sys.argv[1])\n"
        "store.write_sync(\n"
        "    lambda tx: tx.execute(\"INSERT INTO id_counters VALUES ('a', 't', 1)\").rowcount\n"
        ")\n"
        "os._exit(0)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)


def read_only_files(path: Path, writable: bool) -> None:
    """The store's files read-only (0400) or writable (0600) again, as an operator would."""
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        file = path.with_name(name)
        if file.exists():
            file.chmod(0o600 if writable else 0o400)


@pytest.mark.slow
def test_a_store_opened_read_only_accepts_writes_once_it_can(tmp_path: Path) -> None:
    if IS_ROOT:
        with tmpfs(tmp_path / "mnt", "8m") as mnt:
            db = mnt / "masd.db"
            crashed_store(db)
            remount(mnt, "ro")
            try:
                check_read_only_then_writable(db, lambda: remount(mnt, "rw"), "file system")
            finally:
                remount(mnt, "rw")
    else:
        db = tmp_path / "masd.db"
        crashed_store(db)
        read_only_files(db, writable=False)
        check_read_only_then_writable(db, lambda: read_only_files(db, True), "file modes")


def check_read_only_then_writable(db: Path, restore: Callable[[], None], how: str) -> None:
    with Store.open(db) as store:
        health = asyncio.run(store.check())  # no write yet: it tries one
        assert not health.writable, "a read-only store must be found unwritable"
        assert "readonly" in health.detail
        assert not store.health.writable
        with pytest.raises(StoreError, match="readonly"):
            store.write_sync(insert(1))
        assert store.read_sync(counters) == 1  # what was committed can be read
        time.sleep(1.5)  # probed, and reopened, in vain
        restore()
        healed = wait_writable(store)
        assert store.write_sync(insert(2)) == 1
        assert store.read_sync(counters) == 2  # readers see it: they were reopened too
        stats = store.stats
        print(
            f"\nread-only store ({how}): writable again {healed:.2f} s after it was restored,"
            f" {stats.reopens} reopen"
        )
        assert stats.reopens == 1
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
