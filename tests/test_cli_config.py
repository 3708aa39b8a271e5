"""``masd check-config``: through click's CliRunner and as a real ``python -m masd``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.example import EXAMPLE_STORE, STORE_WARNING, copy_example
from support.postgres import Database, postgres_server  # noqa: F401
from support.postgres import postgres as postgres

from masd import __version__
from masd.cli import main
from masd.testing.net import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "packaging" / "masd.toml.example"
T = 'domains."help.example".types.ticket'
C = 'domains."help.example".types.case'


@pytest.fixture
def example_copy(tmp_path: Path) -> Path:
    """The example, with secrets of its own in 0600 token files."""
    return copy_example(tmp_path)


def break_example(path: Path) -> None:
    """Three errors in one file: a bad role, a bad deadline, an unknown key."""
    text = path.read_text()
    for old, new in [
        ('role = "slave"', 'role = "boss"'),
        ('deadline = "2h"', 'deadline = "2 hours"'),
        ('modes = ["callback"]', 'mdoes = ["callback"]\nmodes = ["callback"]'),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)


BROKEN_ERRORS = [
    f"{T}.mdoes: unknown key, did you mean modes?",
    f'{T}.endpoints.callback.deadline: "2 hours" is not a duration (30s, 15m, 2h, 3d)',
    f'{C}.role: "boss" is not "master" or "slave"',
]


def test_example_passes(example_copy: Path) -> None:
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr == STORE_WARNING
    out = result.stdout
    assert out.startswith(f"{example_copy}: OK\n")
    for expected in [
        "lmtp      unix:/run/masd/lmtp.sock",
        "http      127.0.0.1:8025  (public URL http://127.0.0.1:8025)",
        "database  /var/lib/masd/masd.db",
        "domain help.example (no DKIM)",
        "ticket: master, ids gs-<n>",
        "!callback -> http://127.0.0.1:9001/mas  deadline 2h, fields phone, time",
        "case: slave, master http://127.0.0.1:9002/mas",
        "policy: autonomous_send no, transfers block",
        "webhook http://127.0.0.1:9003/  fields phone",
    ]:
        assert expected in out
    assert len(out.splitlines()) <= 24  # one screen


def test_the_example_in_place_is_refused_for_its_placeholder_secrets() -> None:
    """The shipped file as is: every error is a placeholder secret, named by key path and file
    (warnings allowed: a checkout may widen token modes)."""
    result = CliRunner().invoke(main, ["check-config", str(EXAMPLE)])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    placeholders = ROOT / "packaging" / "secrets-example"
    assert errors == [
        f"{key}: {placeholders / name} holds a placeholder secret shipped with masd "
        "(secrets-example), which anyone can read: make your own "
        "(head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE)"
        for key, name in [
            ("server.admin_token_file", "admin.token"),
            (f"{T}.endpoints.callback.token_file", "callback.token"),
            (f"{C}.master.token_file", "crm.token"),
            (f"{C}.webhooks[0].token_file", "transfer.token"),
        ]
    ] + [f"masd: 4 errors in {EXAMPLE}"]


def test_a_copy_of_a_placeholder_secret_is_refused_too(example_copy: Path) -> None:
    shipped = ROOT / "packaging" / "secrets-example" / "admin.token"
    token = example_copy.parent / "secrets-example" / "admin.token"
    token.write_text("  " + shipped.read_text().strip() + "\n")
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"server.admin_token_file: {token} holds a placeholder")


def test_warnings_come_before_the_summary(example_copy: Path) -> None:
    token = example_copy.parent / "secrets-example" / "crm.token"
    token.chmod(0o640)
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: {C}.master.token_file: {token} is readable by group or others (mode 0640); "
        "chmod 600 it\n" + STORE_WARNING
    )
    assert result.output.index("warning:") < result.output.index(": OK")


def test_broken_example_prints_every_error(example_copy: Path) -> None:
    break_example(example_copy)
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [*BROKEN_ERRORS, f"masd: 3 errors in {example_copy}"]


def test_missing_file_is_a_named_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = CliRunner().invoke(main, ["check-config", str(missing)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"{missing}: cannot read: No such file or directory",
        f"masd: 1 error in {missing}",
    ]


def test_bad_toml_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "masd.toml"
    path.write_text("[server]\nlmtp = = 1\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"{path}:2:8: invalid TOML: Invalid value"


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"masd, version {__version__}\n"


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "masd", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_python_dash_m_masd_passes_the_example(example_copy: Path) -> None:
    done = run_module("check-config", str(example_copy))
    assert done.returncode == 0, done.stderr
    assert done.stderr == STORE_WARNING
    assert done.stdout.startswith(f"{example_copy}: OK\n")


def test_python_dash_m_masd_fails_a_broken_copy(example_copy: Path) -> None:
    break_example(example_copy)
    done = run_module("check-config", str(example_copy))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [*BROKEN_ERRORS, f"masd: 3 errors in {example_copy}"]


def test_masd_check_config_suggests_keys_and_names_every_error(example_copy: Path) -> None:
    """The installed ``masd`` command, as an operator runs it."""
    text = example_copy.read_text()
    for old, new in [
        ("max_message_bytes = 26214400", "max_mesage_bytes = 26214400"),
        (
            'trusted_authserv_ids = ["mx.help.example"]',
            'trusted_authserv_ids = ["mx.test_example!"]',
        ),
        ('role = "master"', 'role = "boss"'),
        ('deadline = "2h"', 'deadline = "2 hours"'),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    example_copy.write_text(text)
    masd_command = Path(sys.executable).with_name("masd")
    done = subprocess.run(
        [str(masd_command), "check-config", str(example_copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "server.max_mesage_bytes: unknown key, did you mean max_message_bytes?",
        'server.trusted_authserv_ids[0]: "mx.test_example!" is not an authserv-id: give the host '
        "name your authenticator writes first in Authentication-Results (letters, digits and "
        "hyphens in dot-separated labels, as RFC 8601 recommends)",
        f'{T}.role: "boss" is not "master" or "slave"',
        f'{T}.endpoints.callback.deadline: "2 hours" is not a duration (30s, 15m, 2h, 3d)',
        f"masd: 4 errors in {example_copy}",
    ]


def _with_database(config: Path, line: str) -> None:
    text = config.read_text()
    old = f'database = "{EXAMPLE_STORE}"\n'
    assert text.count(old) == 1
    config.write_text(text.replace(old, f"{line}\n"))


def test_a_store_in_a_missing_directory_is_a_warning_not_an_error(
    example_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "no-such-dir" / "masd.db"
    _with_database(example_copy, f'database = "{store}"')
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: server.database: {store}: its directory {store.parent} does not exist, so "
        "masd cannot create the store there (create it, owned by the user masd runs as)\n"
    )
    assert result.stdout.startswith(f"{example_copy}: OK\n")


def test_a_store_file_not_there_yet_in_its_directory_is_fine(
    example_copy: Path, tmp_path: Path
) -> None:
    _with_database(example_copy, f'database = "{tmp_path / "masd.db"}"')
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert (result.exit_code, result.stderr) == (0, ""), result.output


def test_a_store_that_is_not_an_sqlite_file_is_a_warning(
    example_copy: Path, tmp_path: Path
) -> None:
    store = tmp_path / "masd.db"
    store.write_bytes(b"not a database, " * 256)
    _with_database(example_copy, f'database = "{store}"')
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: server.database: cannot open {store}:"), (
        result.stderr
    )


def test_a_postgresql_server_that_refuses_is_a_warning_naming_where(
    example_copy: Path, tmp_path: Path
) -> None:
    port = free_port()
    _with_database(example_copy, f'database = "postgresql://masd@127.0.0.1:{port}/masd"')
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    warning = (
        f"warning: server.database: cannot open store postgresql://masd@127.0.0.1:{port}/masd:"
    )
    assert result.stderr.startswith(warning), result.stderr
    assert "Connection refused" in result.stderr
    assert result.stdout.startswith(f"{example_copy}: OK\n")


def test_a_postgresql_login_refused_is_a_warning(
    example_copy: Path, tmp_path: Path, postgres: Database
) -> None:
    wrong = tmp_path / "db.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    _with_database(example_copy, f'database = "{postgres.uri}"\ndatabase_password_file = "{wrong}"')
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: server.database: cannot open store {postgres.uri}:")
    assert "password authentication failed" in result.stderr, result.stderr
    assert "not-the-password" not in result.stderr

    wrong.write_text(postgres.password + "\n")
    result = CliRunner().invoke(main, ["check-config", str(example_copy)])
    assert (result.exit_code, result.stderr) == (0, ""), result.output
