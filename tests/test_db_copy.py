"""``masd db copy``: a store filled through masd's own intake, copied SQLite -> PostgreSQL ->
SQLite on a private server, arrives whole: every table's rows, and counters past every id."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.bounces import deliver_raw, postfix_dsn, sent_mails
from support.http import CALLBACK, Running, deliver, serving, status_message
from support.postgres import Database, postgres, postgres_server  # noqa: F401

from masd.cli import main
from masd.store.copy import TABLES
from masd.store.pg_admin import connect

MESSAGES = "/mas/v0.1/messages"


def fill(tmp_path: Path) -> Path:
    """A store holding what masd writes: cases, mail, handoffs, statuses, answers, outbox."""

    async def run() -> None:
        async with serving(tmp_path) as r:
            for subject in ("Printer jams", "Screen is dark"):
                key, hid = await r.open_callback_case(subject)
                for seq, status in enumerate(("running", "completed"), start=1):
                    await _post(r, status_message(key, hid, seq, status))
            await deliver(r.store, r.rt, "case@help.example", r.clock.now())
            await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), body="é ü\x00")
            ack = (await sent_mails(r.store))[-1]  # and the acknowledgement bounced
            dsn = postfix_dsn(ack.mail_from, ack.rcpt_to)
            await deliver_raw(r.store, r.rt, ack.mail_from, dsn, r.clock.now())

    asyncio.run(run())
    database = tmp_path / "masd.db"
    with sqlite3.connect(database) as conn:  # what housekeeping does to a delivered row
        top = conn.execute("SELECT max(id) FROM outbox WHERE case_key IS NOT NULL").fetchone()[0]
        conn.execute("UPDATE outbox SET state = 'done', done_at = 1 WHERE id = ?", (top,))
        conn.execute("DELETE FROM outbox WHERE id = ?", (top,))
    conn.close()
    return database


async def _post(r: Running, message: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {CALLBACK}"}
    answer = await r.client.post(MESSAGES, content=json.dumps(message).encode(), headers=headers)
    assert answer.status_code == 200, answer.text


def sqlite_rows(path: Path, table: str, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        listed = ", ".join(columns) if columns else "*"
        return sorted(conn.execute(f"SELECT {listed} FROM {table}").fetchall(), key=repr)
    finally:
        conn.close()


def sqlite_columns(path: Path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def pg_rows(db: Database, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    with connect(db.uri, db.password) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
    return sorted(rows, key=repr)


def copy(*args: str) -> Any:
    return CliRunner().invoke(main, ["db", "copy", *args])


@pytest.fixture
def password_file(tmp_path: Path, postgres: Database) -> Path:  # noqa: F811
    path = tmp_path / "db.password"
    path.write_text(postgres.password + "\n")
    path.chmod(0o600)
    return path


def test_a_store_goes_to_postgresql_and_back_whole(
    tmp_path: Path,
    postgres: Database,  # noqa: F811
    password_file: Path,
) -> None:
    source = fill(tmp_path)
    counts = {t: len(sqlite_rows(source, t)) for t in TABLES}
    filled = {t for t, n in counts.items() if n}
    assert filled == set(TABLES), counts  # the intake touched every table

    there = copy(str(source), postgres.uri, "--password-file", str(password_file))
    assert there.exit_code == 0, there.output
    width = max(map(len, TABLES))
    for table in TABLES:
        assert f"{table:<{width}}  {counts[table]}" in there.output.splitlines(), there.output
    assert f"copied {sum(counts.values())} rows" in there.output
    for table in TABLES:
        columns = sqlite_columns(source, table)
        assert pg_rows(postgres, table, columns) == sqlite_rows(source, table), table

    back = tmp_path / "back.db"
    again = copy(postgres.uri, str(back), "--password-file", str(password_file))
    assert again.exit_code == 0, again.output
    for table in (*TABLES, "sqlite_sequence"):
        assert sqlite_rows(back, table) == sqlite_rows(source, table), table


def test_new_ids_come_after_every_copied_one(
    tmp_path: Path,
    postgres: Database,  # noqa: F811
    password_file: Path,
) -> None:
    source = fill(tmp_path)
    done = copy(str(source), postgres.uri, "--password-file", str(password_file))
    assert done.exit_code == 0, done.output
    (kept,) = sqlite_rows(source, "outbox_sent", ["id"])
    with connect(postgres.uri, postgres.password) as conn:
        (highest,) = conn.execute("SELECT max(id) FROM outbox").fetchone() or (0,)
        assert kept[0] > highest  # the deleted row's id is kept, and the sequence passed it
        new = conn.execute(
            "INSERT INTO outbox (kind, queue, payload, created_at, next_attempt_at, "
            "deliver_until) VALUES ('mail', 'q', '{}', 0, 0, 0) RETURNING id"
        ).fetchone()
        pos = conn.execute(
            "INSERT INTO thread (case_key, seq, kind, at) SELECT key, 999, 'status', 0 "
            "FROM cases LIMIT 1 RETURNING pos"
        ).fetchone()
    assert new is not None
    assert new[0] == kept[0] + 1
    assert pos is not None
    # PostgreSQL makes a position from its writer's transaction id: past every copied one.
    assert pos[0] > max(r[0] for r in sqlite_rows(source, "thread", ["pos"]))


def test_a_destination_that_is_not_empty_is_refused_by_name(
    tmp_path: Path,
    postgres: Database,  # noqa: F811
    password_file: Path,
) -> None:
    source = fill(tmp_path)
    assert copy(str(source), postgres.uri, "--password-file", str(password_file)).exit_code == 0
    twice = copy(str(source), postgres.uri, "--password-file", str(password_file))
    assert twice.exit_code == 1
    assert (
        f"masd: destination {postgres.uri} is not empty: table id_counters holds 1 row; "
        "copy only into a new or empty store"
    ) in twice.output
    into_itself = copy(str(source), str(source))
    assert into_itself.exit_code == 1
    assert f"destination {source} is not empty: table id_counters" in into_itself.output


def test_a_copy_that_fails_leaves_the_destination_empty(
    tmp_path: Path,
    postgres: Database,  # noqa: F811
    password_file: Path,
) -> None:
    source = fill(tmp_path)
    with sqlite3.connect(source) as conn:  # SQLite keeps a NUL in TEXT; PostgreSQL cannot
        conn.execute("UPDATE cases SET participant = ? WHERE rowid = 2", ("a\x00b",))
    conn.close()
    failed = copy(str(source), postgres.uri, "--password-file", str(password_file))
    assert failed.exit_code == 1
    assert f"masd: cannot copy into {postgres.uri}: cases: " in failed.output
    with connect(postgres.uri, postgres.password) as pg:
        for table in TABLES:
            assert pg.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    with sqlite3.connect(source) as conn:
        conn.execute("UPDATE cases SET participant = 'ab' WHERE rowid = 2")
    conn.close()
    again = copy(str(source), postgres.uri, "--password-file", str(password_file))
    assert again.exit_code == 0, again.output


def test_refusals_name_what_is_wrong(tmp_path: Path, postgres: Database) -> None:  # noqa: F811
    missing = copy(str(tmp_path / "none.db"), postgres.uri)
    assert missing.exit_code == 1
    assert f"cannot copy store {tmp_path / 'none.db'}: no such file" in missing.output
    with_password = copy(str(tmp_path / "x.db"), "postgresql://masd:pw@127.0.0.1/masd")
    assert with_password.exit_code == 1
    assert "DEST holds a password, which is refused in the URI: put it in --password-file" in (
        with_password.output
    )
    assert "pw@" not in with_password.output
    other = copy("mysql://db/masd", str(tmp_path / "x.db"))
    assert 'SOURCE "mysql://..." is not a store' in other.output
    (tmp_path / "open.password").write_text("x\n")
    (tmp_path / "open.password").chmod(0o644)
    loose = copy(
        str(tmp_path / "x.db"), postgres.uri, "--password-file", str(tmp_path / "open.password")
    )
    assert "is readable by group or others (mode 0644)" in loose.output
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-it\n")
    wrong.chmod(0o600)
    refused = copy(postgres.uri, str(tmp_path / "y.db"), "--password-file", str(wrong))
    assert refused.exit_code == 1
    assert "password authentication failed" in refused.output
    assert "not-it" not in refused.output
    assert not (tmp_path / "y.db").exists()  # the source is opened first: nothing made


def test_db_migrate_on_postgresql_and_backup_refused(
    tmp_path: Path,
    postgres: Database,  # noqa: F811
    password_file: Path,
) -> None:
    config = tmp_path / "masd.toml"
    config.write_text(
        f'[server]\ndatabase = "{postgres.uri}"\n'
        f'database_password_file = "{password_file}"\n'
        'trusted_authserv_ids = ["mx.help.example"]\n\n'
        '[domains."help.example".types.ticket]\nrole = "master"\n'
    )
    runner = CliRunner()
    first = runner.invoke(main, ["db", "migrate", "--config", str(config)])
    assert first.exit_code == 0, first.output
    assert first.output.strip() == (
        "applied: initial, read-side, raw-last, bounces, erasable, hosts-add-up, keyed-tables, "
        "thread-seq"
    )
    second = runner.invoke(main, ["db", "migrate", "--config", str(config)])
    assert second.output.strip() == "up to date"
    backup = runner.invoke(main, ["db", "backup", "--config", str(config), str(tmp_path / "b.db")])
    assert backup.exit_code == 1
    assert "pg_dump" in backup.output
    assert postgres.uri in backup.output
    assert not (tmp_path / "b.db").exists()
