"""README.md says what the code does."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from support.example import STORE_WARNING, copy_example
from support.system import require_program

from masd._resources import conformance_file

ROOT = Path(__file__).resolve().parent.parent


def test_readme_status_table_is_drawn_from_transitions_json() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- transitions:begin -->\n(.*?)<!-- transitions:end -->", readme, re.S)
    assert block is not None
    rows = {}
    for line in block.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [s.strip() for s in cells[1].split(",")]
    table = json.loads(conformance_file("transitions.json").read_text())["transitions"]
    assert rows == table


def test_readme_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme
    assert "make test" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)


def test_make_check_runs_the_tests_not_marked_slow_and_make_test_runs_all() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`make check` runs ruff, mypy and every test not marked `slow`" in readme
    make = require_program("make")

    def steps(target: str) -> list[str]:
        done = subprocess.run(
            [make, "--dry-run", "--always-make", "--no-print-directory", "-C", str(ROOT), target],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.splitlines()

    check, test = steps("check"), steps("test")
    for lines in (check, test):
        assert any(line.endswith("/ruff check masd tests") for line in lines), lines
        assert any(line.endswith("/mypy") for line in lines), lines
    (fast,) = [line for line in check if "/pytest " in line]
    assert fast.endswith('-m "not slow"'), fast
    assert "-n auto" in fast
    (full,) = [line for line in test if "/pytest" in line.split()[0]]
    assert "-m" not in full.split(), full


def fresh_clone(tmp_path: Path) -> Path:
    """The Makefile and packaging/ as a clone gets them: git keeps no modes but the
    executable bit, so every token file is 0644 (umask 022)."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "packaging", clone / "packaging")
    for path in (clone / "packaging").rglob("*"):
        if path.is_file():
            path.chmod(0o755 if os.access(path, os.X_OK) else 0o644)
    shutil.copy2(ROOT / "Makefile", clone / "Makefile")
    return clone


def first_using_masd_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Using masd\n\n```sh\n(.*?)```", readme, re.S)
    assert block is not None
    command = block.group(1).splitlines()[0].split("#")[0].split()
    assert command[:2] == [".venv/bin/masd", "check-config"], command
    return [str(Path(sys.executable).with_name("masd")), *command[1:]]


def test_every_make_target_on_the_virtualenv_first_gives_the_example_secrets_0600() -> None:
    make = require_program("make")
    for target in ("demo", "test", "check", "conformance"):
        done = subprocess.run(
            [make, "--dry-run", "--always-make", "--no-print-directory", "-C", str(ROOT), target],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        lines = done.stdout.splitlines()
        assert lines[0] == "chmod 600 packaging/secrets-example/*.token", (target, lines)


def test_the_first_command_of_using_masd_names_the_placeholder_secrets(tmp_path: Path) -> None:
    """README: make demo (or make test), then check-config on the example: its four public
    placeholder secrets are refused and nothing else is said, while a real secret left
    readable is warned about."""
    make = require_program("make")
    clone = fresh_clone(tmp_path)
    token = clone / "packaging" / "secrets-example" / "admin.token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o644
    command = first_using_masd_command()

    subprocess.run([make, "-C", str(clone), "example-secrets"], timeout=60, check=True)
    done = subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 5, lines
    assert all("holds a placeholder secret shipped with masd" in line for line in lines[:4])
    assert lines[0].startswith(f"server.admin_token_file: {token} holds a placeholder")
    assert lines[4] == "masd: 4 errors in packaging/masd.toml.example"

    for n, other in enumerate(sorted(token.parent.glob("*.token"))):
        other.write_text(f"a-real-secret-000{n}\n")
    token.chmod(0o644)
    done = subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"warning: server.admin_token_file: {token} is readable by group or others "
        "(mode 0644); chmod 600 it\n" + STORE_WARNING
    )
    assert done.stdout.startswith("packaging/masd.toml.example: OK\n")


def test_the_check_config_errors_quoted_in_the_readme_are_masd_s(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"for a misspelt one, for instance\n\n```\n(.*?)```", readme, re.S)
    assert block is not None
    text = copy_example(tmp_path).read_text()
    for old, new in [
        ("max_message_bytes = 26214400", "max_mesage_bytes = 26214400"),
        ('role = "master"', 'role = "boss"'),
        ('deadline = "2h"', 'deadline = "2 hours"'),
    ]:
        text = text.replace(old, new)
    (tmp_path / "masd.toml").write_text(text)
    command = [str(Path(sys.executable).with_name("masd")), "check-config", "masd.toml"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [*block.group(1).splitlines(), "masd: 3 errors in masd.toml"]
