"""The operator's commands: masd case show / case list, masd db migrate / db backup."""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.masd_process import write_master_config

from masd.cli import main
from masd.config import load_config
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.service import Runtime, deliver
from masd.store import Store

MAIL = (
    b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.com\r\n"
    b"From: Alice <alice@example.com>\r\nTo: ticket!callback@help.example\r\n"
    b"Subject: Call me\r\nMessage-ID: <op-1@example.com>\r\n\r\nphone: +1 555 0100\r\n"
)


def _one_case(tmp_path: Path) -> Path:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    config = load_config(setup.config)
    counter = itertools.count(1)
    rt = Runtime(config, lambda: f"id-{next(counter)}")
    mail = build_event(
        MAIL,
        mail_from="alice@example.com",
        rcpt_to="ticket!callback@help.example",
        received_at="2026-11-29T10:00:00Z",
        message_ref="msg-op-1",
        trust=rt.trust(),
    )
    rcpt = parse_address("ticket!callback@help.example")
    with Store.open(config.server.database) as store:
        store.write_sync(lambda db: deliver(rt, db, rcpt, mail, MAIL, "0" * 64, 1_790_000_000.0))
    return setup.config


def test_case_list_and_show_print_the_case_and_its_timeline(tmp_path: Path) -> None:
    config = _one_case(tmp_path)
    runner = CliRunner()
    listed = runner.invoke(main, ["case", "list", "--config", str(config)])
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "KEY",
        "ROLE",
        "PARTICIPANT",
        "OPENED",
        "LAST",
        "ACTIVITY",
        "OPEN",
        "HANDOFF",
    ]
    fields = row.split()
    assert fields[:3] == ["ticket=ticket-1@help.example", "master", "alice@example.com"]
    assert fields[-1] == "callback:requested"
    # Any spelling of the address finds the case (its equivalence key).
    shown = runner.invoke(
        main, ["case", "show", "--config", str(config), "TICKET=Ticket-1@Help.Example"]
    )
    assert shown.exit_code == 0, shown.output
    for text in ("ticket=ticket-1@help.example", "mail.in", "alice@example.com", "handoff.request"):
        assert text in shown.output


def test_case_show_refuses_by_name(tmp_path: Path) -> None:
    config = _one_case(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(
        main, ["case", "show", "--config", str(config), "ticket=nope@help.example"]
    )
    assert missing.exit_code == 1
    assert "no case ticket=nope@help.example" in missing.output
    bad = runner.invoke(main, ["case", "show", "--config", str(config), "ticket=a/b@help.example"])
    assert bad.exit_code == 1
    assert 'character "/"' in bad.output


def test_db_migrate_and_backup(tmp_path: Path) -> None:
    config = _one_case(tmp_path)
    runner = CliRunner()
    migrated = runner.invoke(main, ["db", "migrate", "--config", str(config)])
    assert migrated.exit_code == 0, migrated.output
    assert "up to date" in migrated.output
    copy = tmp_path / "copy.db"
    backed = runner.invoke(main, ["db", "backup", "--config", str(config), str(copy)])
    assert backed.exit_code == 0, backed.output
    with Store.open(copy) as store:
        keys = store.read_sync(lambda db: db.execute("SELECT key FROM cases").fetchall())
    assert keys == [("ticket=ticket-1@help.example",)]


def test_db_migrate_on_a_fresh_path_creates_the_schema(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    result = CliRunner().invoke(main, ["db", "migrate", "--config", str(setup.config)])
    assert result.exit_code == 0, result.output
    assert "applied: initial" in result.output


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A umask that would leave new files readable by everyone (0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_store_and_its_backup_are_for_masd_alone(tmp_path: Path, loose_umask: None) -> None:
    """The store holds every case's mail: masd creates it (and its -wal and -shm files, and a
    backup) mode 0600 whatever the umask."""
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    database = load_config(setup.config).server.database
    assert not database.exists()
    with Store.open(database) as store:
        store.write_sync(lambda db: db.execute("SELECT count(*) FROM cases").fetchall())
        created = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*.db*")}
    name = database.name
    assert created == {name: 0o600, f"{name}-wal": 0o600, f"{name}-shm": 0o600}
    copy = tmp_path / "copy.db"
    runner = CliRunner()
    backed = runner.invoke(main, ["db", "backup", "--config", str(setup.config), str(copy)])
    assert backed.exit_code == 0, backed.output
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600


def test_db_migrate_creates_the_store_mode_0600(tmp_path: Path, loose_umask: None) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    result = CliRunner().invoke(main, ["db", "migrate", "--config", str(setup.config)])
    assert result.exit_code == 0, result.output
    database = load_config(setup.config).server.database
    assert stat.S_IMODE(database.stat().st_mode) == 0o600


def test_an_existing_store_keeps_the_mode_the_operator_gave_it(
    tmp_path: Path, loose_umask: None
) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    database = load_config(setup.config).server.database
    with Store.open(database):
        pass
    database.chmod(0o640)  # e.g. a group allowed to read backups
    with Store.open(database):
        pass
    assert stat.S_IMODE(database.stat().st_mode) == 0o640
