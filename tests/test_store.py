"""The SQLite store on real files: PRAGMAs, migrations, group commit, reads, backup."""

from __future__ import annotations

import asyncio
import functools
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from masd.core.errors import MasdError
from masd.store import (
    MAX_BATCH,
    MIGRATIONS,
    Migration,
    Store,
    StoreError,
    append_thread,
    backup,
    migrate,
    next_number,
)

TABLES = {
    "id_counters",
    "cases",
    "intakes",
    "messages",
    "deliveries",
    "handoffs",
    "statuses",
    "thread",
    "outbox",
    "outbox_sent",
    "idempotency",
    "send_log",
    "bounce_key",
    "bounces",
    "suppressions",
    "masd_migrations",
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "masd.db")
    yield s
    s.close()


def add_case(db: Database, n: int, *, at: float = 1000.0) -> str:
    key = f"ticket=t-{n}@help.example"
    db.execute(
        "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at)"
        " VALUES (?, ?, 'help.example', 'ticket', ?, 'master', 'p@example.org', ?)",
        (key, key, f"t-{n}", at),
    )
    return key


def case_job(n: int) -> Callable[[Database], str]:
    return lambda db: add_case(db, n)


def case_count(db: Database) -> int:
    return int(db.execute("SELECT count(*) FROM cases").fetchone()[0])


class Gate:
    """A job that holds the writer until released, so later jobs queue up."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def job(self, db: Database) -> str:
        self.started.set()
        if not self.release.wait(timeout=30):
            raise AssertionError("gate never released")
        return "gate"


# -- opening, PRAGMAs, migrations ---------------------------------------------


def pragmas(db: Database) -> dict[str, Any]:
    return {
        name: db.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys", "temp_store")
    }


EXPECTED_PRAGMAS = {
    "journal_mode": "wal",
    "synchronous": 2,
    "busy_timeout": 5000,
    "foreign_keys": 1,
    "temp_store": 2,  # MEMORY: no statement-journal files in the temp directory
}


def test_pragmas_on_writer_and_reader(store: Store) -> None:
    assert store.write_sync(pragmas) == EXPECTED_PRAGMAS
    assert store.read_sync(pragmas) == EXPECTED_PRAGMAS
    assert store.read_sync(lambda db: db.execute("PRAGMA query_only").fetchone()[0]) == 1


def test_schema_and_migrations_recorded(store: Store) -> None:
    names = store.read_sync(lambda db: set(db.table_names()))
    assert names >= TABLES
    rows = store.read_sync(
        lambda db: [tuple(r) for r in db.execute("SELECT version, name FROM masd_migrations")]
    )
    assert rows == [(m.version, m.name) for m in MIGRATIONS]
    strict = store.read_sync(
        lambda db: [r[0] for r in db.execute("SELECT name FROM pragma_table_list WHERE strict")]
    )
    assert set(strict) == TABLES - {"masd_migrations"}


def test_migrate_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    assert migrate(path) == [m.name for m in MIGRATIONS]
    assert migrate(path) == []
    Store.open(path).close()
    assert migrate(path) == []
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM masd_migrations").fetchone()[0] == len(MIGRATIONS)
    conn.close()


def test_extra_migration_sql_and_callable(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    def add_note(db: Database) -> None:
        db.execute("INSERT INTO note (text) VALUES ('a; b')")

    last = MIGRATIONS[-1].version
    extended = [
        *MIGRATIONS,
        Migration(
            last + 1,
            "note",
            "CREATE TABLE note (text TEXT); CREATE INDEX note_text ON note (text);",
        ),
        Migration(last + 2, "note-row", add_note),
    ]
    names = [m.name for m in MIGRATIONS]
    assert migrate(path, migrations=extended) == [*names, "note", "note-row"]
    assert migrate(path, migrations=extended) == []
    with _raw(path) as conn:
        assert conn.execute("SELECT text FROM note").fetchall() == [("a; b",)]
    # This masd knows only MIGRATIONS: the database is newer, so it is refused.
    with pytest.raises(StoreError) as err:
        Store.open(path)
    assert f"version {last + 2}" in err.value.detail
    assert f"version {MIGRATIONS[-1].version}" in err.value.detail
    assert err.value.code == "store-unavailable"


class _raw:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path)

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def test_refuses_newer_recorded_version(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    migrate(path)
    with _raw(path) as conn:
        conn.execute("INSERT INTO masd_migrations VALUES (99, 'from-the-future', 0)")
        conn.commit()
    for migrate_on_open in (True, False):
        newer = rf"version 99 .*newer than version {MIGRATIONS[-1].version}"
        with pytest.raises(StoreError, match=newer):
            Store.open(path, migrate=migrate_on_open)
    with pytest.raises(StoreError, match="version 99"):
        migrate(path)


def test_refuses_renamed_migration(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    migrate(path)
    with _raw(path) as conn:
        conn.execute("UPDATE masd_migrations SET name = 'other' WHERE version = 1")
        conn.commit()
    with pytest.raises(StoreError, match="records migration 1 as 'other'"):
        Store.open(path)


def test_failed_migration_rolls_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    last = MIGRATIONS[-1].version
    broken = [
        *MIGRATIONS,
        Migration(last + 1, "broken", "CREATE TABLE half (x); INSERT INTO nope VALUES (1);"),
    ]
    failed = rf"migration {last + 1} \(broken\) failed.*no such table: nope"
    with pytest.raises(StoreError, match=failed):
        migrate(path, migrations=broken)
    with _raw(path) as conn:
        assert conn.execute("SELECT max(version) FROM masd_migrations").fetchone()[0] == last
        assert conn.execute("SELECT name FROM sqlite_schema WHERE name = 'half'").fetchall() == []


def test_open_without_migrate_needs_current_schema(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    with pytest.raises(StoreError, match=r"schema version 0.*pending migrations \['initial', "):
        Store.open(path, migrate=False)
    migrate(path)
    s = Store.open(path, migrate=False)
    assert s.path == path
    s.close()


def test_missing_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(StoreError) as err:
        Store.open(missing / "masd.db")
    assert err.value.code == "store-unavailable"
    assert f"directory {missing} does not exist" in err.value.detail
    assert not missing.exists()


def test_corrupt_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "masd.db"
    path.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(StoreError) as err:
        Store.open(path)
    assert str(path) in err.value.detail
    assert "not a database" in err.value.detail


def test_directory_as_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"cannot open store {tmp_path}"):
        Store.open(tmp_path)


# -- writes ---------------------------------------------------------------------


def test_async_write_then_read(store: Store) -> None:
    async def main() -> tuple[str, list[dict[str, Any]]]:
        key = await store.write(lambda db: add_case(db, 1))
        rows = await store.read(lambda db: list(db.query("SELECT key, role FROM cases")))
        return key, rows

    key, rows = asyncio.run(main())
    assert key == "ticket=t-1@help.example"
    assert rows == [{"key": key, "role": "master"}]


def test_group_commit_batches_concurrent_writes(store: Store) -> None:
    gate = Gate()

    async def main() -> list[str]:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        tasks = [asyncio.create_task(store.write(case_job(n))) for n in range(200)]
        await asyncio.sleep(0)  # every task has now submitted its job
        gate.release.set()
        assert await held == "gate"
        return await asyncio.gather(*tasks)

    keys = asyncio.run(main())
    assert len(set(keys)) == 200
    stats = store.stats
    assert stats.jobs == 201
    assert stats.batches < stats.jobs
    assert stats.largest_batch == 200
    assert store.read_sync(case_count) == 200


def test_batch_size_is_bounded(store: Store) -> None:
    gate = Gate()

    async def main() -> None:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        tasks = [asyncio.create_task(store.write(case_job(n))) for n in range(MAX_BATCH + 44)]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert store.stats.largest_batch == MAX_BATCH
    assert store.stats.batches == 3
    assert store.read_sync(case_count) == MAX_BATCH + 44


def test_failing_job_rolls_back_alone(store: Store) -> None:
    gate = Gate()

    def bad(db: Database) -> None:
        add_case(db, 2)
        raise ValueError("refused by the job")

    def dup(db: Database) -> None:
        add_case(db, 4)
        add_case(db, 1)  # inserted by an earlier job of the batch: IntegrityError

    async def main() -> list[Any]:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        tasks = [
            asyncio.create_task(store.write(fn))
            for fn in (lambda db: add_case(db, 1), bad, lambda db: add_case(db, 3), dup)
        ]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        return await asyncio.gather(*tasks, return_exceptions=True)

    ok1, err, ok3, err_dup = asyncio.run(main())
    assert ok1 == "ticket=t-1@help.example"
    assert ok3 == "ticket=t-3@help.example"
    assert isinstance(err, ValueError)
    assert isinstance(err_dup, StoreError)
    assert "UNIQUE constraint failed: cases." in err_dup.detail
    assert isinstance(err_dup.__cause__, sqlite3.IntegrityError)
    assert store.stats.largest_batch == 4  # all four shared one transaction
    assert store.stats.failed_jobs == 2
    ids = store.read_sync(lambda db: [r[0] for r in db.execute("SELECT id FROM cases ORDER BY id")])
    assert ids == ["t-1", "t-3"]


def test_lost_transaction_fails_its_jobs_and_the_rest_go_on(store: Store) -> None:
    """A trigger doing RAISE(ROLLBACK) makes SQLite drop the whole transaction."""
    gate = Gate()

    def poison(db: Database) -> None:
        db.execute(
            "CREATE TEMP TRIGGER boom BEFORE INSERT ON cases "
            "BEGIN SELECT RAISE(ROLLBACK, 'boom'); END"
        )
        add_case(db, 2)

    async def main() -> list[Any]:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        tasks = [
            asyncio.create_task(store.write(fn))
            for fn in (lambda db: add_case(db, 1), poison, lambda db: add_case(db, 3))
        ]
        await asyncio.sleep(0)
        gate.release.set()
        await held
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, poisoned, last = asyncio.run(main())
    assert isinstance(first, StoreError)
    assert "transaction lost" in first.detail
    assert isinstance(poisoned, StoreError)
    assert last == "ticket=t-3@help.example"
    assert store.stats.failed_batches == 1
    ids = store.read_sync(lambda db: [r[0] for r in db.execute("SELECT id FROM cases")])
    assert ids == ["t-3"]
    # The trigger went with the transaction; the store still writes.
    assert store.write_sync(lambda db: add_case(db, 5)) == "ticket=t-5@help.example"


@pytest.mark.parametrize(
    "sql",
    [
        "COMMIT",
        "ROLLBACK",
        "BEGIN",
        "RELEASE masd_job",
        "ROLLBACK TO masd_job",
        "PRAGMA defer_foreign_keys=ON",
        "PRAGMA foreign_keys=OFF",
        "PRAGMA synchronous=OFF",
        "PRAGMA temp_store=FILE",
    ],
)
def test_job_may_not_control_the_transaction(store: Store, sql: str) -> None:
    def job(db: Database) -> None:
        add_case(db, 1)
        db.execute(sql)

    with pytest.raises(StoreError, match=r"not authorized \(SQLITE_AUTH\); a job may not"):
        store.write_sync(job)
    assert store.write_sync(pragmas) == EXPECTED_PRAGMAS
    assert store.read_sync(case_count) == 0
    assert store.write_sync(lambda db: add_case(db, 2))
    assert store.read_sync(case_count) == 1


def test_nested_atomic_inside_a_job_is_fine(store: Store) -> None:
    def job(db: Database) -> int:
        with db.atomic():
            add_case(db, 1)
        with pytest.raises(sqlite3.IntegrityError), db.atomic():
            add_case(db, 1)
        db.table("cases").update("ticket=t-1@help.example", {"sent_count": 1})
        return case_count(db)

    assert store.write_sync(job) == 1


def test_lazy_results_are_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="returned a lazy generator"):
        store.write_sync(lambda db: db.query("SELECT 1"))
    with pytest.raises(StoreError, match="lazy Cursor"):
        store.read_sync(lambda db: db.execute("SELECT 1"))


def test_write_sync_from_several_threads(store: Store) -> None:
    def job(db: Database) -> int:
        n = next_number(db, "help.example", "ticket")
        add_case(db, n)
        return n

    results: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(25):
                n = store.write_sync(job)
                with lock:
                    results.append(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == list(range(1, 201))
    assert store.read_sync(case_count) == 200


def test_sync_calls_refused_on_a_running_loop(store: Store) -> None:
    async def main() -> None:
        with pytest.raises(StoreError, match="use await write"):
            store.write_sync(case_count)
        with pytest.raises(StoreError, match="use await read"):
            store.read_sync(case_count)

    asyncio.run(main())


def test_cancelled_write_still_runs(store: Store) -> None:
    gate = Gate()

    async def main() -> None:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        task = asyncio.create_task(store.write(lambda db: add_case(db, 1)))
        await asyncio.sleep(0)  # submitted
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release.set()
        await held
        await store.write(case_count)  # a barrier: every earlier job has been answered

    asyncio.run(main())
    assert store.read_sync(case_count) == 1


def test_close_drains_the_queue(tmp_path: Path) -> None:
    path = tmp_path / "masd.db"
    store = Store.open(path)
    gate = Gate()

    async def main() -> list[str]:
        held = asyncio.create_task(store.write(gate.job))
        await asyncio.to_thread(gate.started.wait)
        tasks = [asyncio.create_task(store.write(case_job(n))) for n in range(50)]
        await asyncio.sleep(0)
        closing = asyncio.create_task(asyncio.to_thread(store.close))
        gate.release.set()
        await closing
        with pytest.raises(StoreError, match="is closed"):
            await store.write(case_count)
        with pytest.raises(StoreError, match="is closed"):
            await store.read(case_count)
        await held
        return await asyncio.gather(*tasks)

    keys = asyncio.run(main())
    assert len(keys) == 50
    store.close()  # idempotent
    with Store.open(path) as again:
        assert again.read_sync(case_count) == 50


# -- reads ----------------------------------------------------------------------


def test_read_sees_committed_state_without_waiting_for_the_writer(store: Store) -> None:
    inserted = threading.Event()
    release = threading.Event()

    def slow(db: Database) -> None:
        add_case(db, 1)
        inserted.set()
        if not release.wait(timeout=30):
            raise AssertionError("never released")

    async def main() -> tuple[int, int]:
        writing = asyncio.create_task(store.write(slow))
        await asyncio.to_thread(inserted.wait)
        during = await store.read(case_count)  # the writer holds an open transaction
        release.set()
        await writing
        after = await store.read(case_count)
        return during, after

    assert asyncio.run(main()) == (0, 1)


def test_readers_cannot_write(store: Store) -> None:
    with pytest.raises(StoreError, match="readonly"):
        store.read_sync(lambda db: add_case(db, 1))


# -- schema rules and helpers ---------------------------------------------------


def test_schema_constraints(store: Store) -> None:
    with pytest.raises(StoreError, match="FOREIGN KEY"):
        store.write_sync(
            lambda db: db.execute(
                "INSERT INTO handoffs (handoff_id, case_key, mode, status, requested_at) "
                "VALUES ('h', 'nope', 'support', 'requested', 1.0)"
            )
        )
    with pytest.raises(StoreError, match="cannot store TEXT value in REAL column"):
        store.write_sync(lambda db: add_case(db, 1, at="2024-01-01T00:00:00Z"))  # type: ignore[arg-type]

    def bad_policy(db: Database) -> None:
        key = add_case(db, 1)
        db.execute("UPDATE cases SET policy = 'not json' WHERE key = ?", (key,))

    with pytest.raises(StoreError, match="CHECK constraint failed"):
        store.write_sync(bad_policy)
    assert store.read_sync(case_count) == 0


def test_next_number_and_thread_helpers(store: Store) -> None:
    def job(db: Database) -> tuple[int, int, int]:
        a = next_number(db, "help.example", "ticket")
        b = next_number(db, "help.example", "ticket")
        c = next_number(db, "other.example", "ticket")
        key = add_case(db, a)
        append_thread(db, key, "mail.in", {"message_ref": "m1"}, at=1.5)
        append_thread(db, key, "status", {"status": "requested"}, at=2)
        return a, b, c

    assert store.write_sync(job) == (1, 2, 1)
    rows = store.read_sync(
        lambda db: list(db.query("SELECT seq, kind, at, data FROM thread ORDER BY seq"))
    )
    assert rows == [
        {"seq": 1, "kind": "mail.in", "at": 1.5, "data": '{"message_ref":"m1"}'},
        {"seq": 2, "kind": "status", "at": 2.0, "data": '{"status":"requested"}'},
    ]
    with pytest.raises(MasdError) as err:
        store.write_sync(lambda db: append_thread(db, "nope", "mail.in", {}, at=1))
    assert err.value.code == "unknown-case"
    with pytest.raises(MasdError) as err:
        store.write_sync(lambda db: append_thread(db, "ticket=t-1@help.example", "mail", {}, at=1))
    assert err.value.code == "bad-thread-kind"


def test_backup_is_a_readable_copy(store: Store, tmp_path: Path) -> None:
    for n in range(1, 6):
        store.write_sync(case_job(n))
    dest = tmp_path / "backups" / "copy.db"
    dest.parent.mkdir()
    backup(store.path, dest)  # the store is open and live
    backup(store.path, dest)  # replacing an older copy
    assert sorted(p.name for p in dest.parent.iterdir()) == ["copy.db"]
    with _raw(dest) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM cases").fetchone()[0] == 5
    with Store.open(dest, migrate=False) as copy:
        assert copy.read_sync(case_count) == 5
    with pytest.raises(StoreError, match="does not exist"):
        backup(store.path, tmp_path / "missing" / "x.db")
    with pytest.raises(StoreError, match="no such file"):
        backup(tmp_path / "absent.db", dest)


def test_the_writer_leaves_checkpoints_to_the_checkpointer(tmp_path: Path) -> None:
    """The committing connection never checkpoints; the checkpointer thread does."""
    import time

    path = tmp_path / "masd.db"
    with Store.open(path) as store:
        assert (
            store.write_sync(lambda db: db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]) == 0
        )
        limit = store.write_sync(lambda db: db.execute("PRAGMA journal_size_limit").fetchone()[0])
        assert limit == 64 * 1024 * 1024
        before = path.stat().st_size

        def insert(db: Database, n: int) -> None:
            db.execute(
                "INSERT INTO send_log (case_key, recipient, at) VALUES (?, ?, ?)",
                (f"case-{n}", "x" * 4000, float(n)),
            )

        for n in range(20):
            store.write_sync(functools.partial(insert, n=n))
        # Only a checkpoint moves pages from the WAL into the database file.
        deadline = time.monotonic() + 10
        while path.stat().st_size <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert path.stat().st_size > before


@pytest.mark.slow
def test_the_wal_is_started_over_under_steady_writes(tmp_path: Path) -> None:
    """Commits that never pause would grow the WAL without end (a PASSIVE
    checkpoint never catches up, so SQLite never starts the log over); past
    the limit the checkpointer restarts it."""
    path = tmp_path / "masd.db"
    wal = Path(f"{path}-wal")
    limit = 1024 * 1024
    written = 0
    largest = 0
    with Store.open(path, wal_limit_bytes=limit, checkpoint_seconds=0.02) as store:

        def insert(db: Database, n: int) -> None:
            db.execute(
                "INSERT INTO send_log (case_key, recipient, at) VALUES (?, ?, ?)",
                (f"case-{n}", secrets.token_hex(4000), float(n)),
            )

        n = 0
        while written < 24 * limit:
            store.write_sync(functools.partial(insert, n=n))
            n += 1
            written += 8000
            largest = max(largest, wal.stat().st_size)
    # Without the restart the WAL would hold everything written (24 MiB and more).
    assert largest < 12 * limit, (largest, written)
