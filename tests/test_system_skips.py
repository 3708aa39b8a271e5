"""A test that needs a system program says which Debian package would run it, and
MASD_REQUIRE_SYSTEM_TESTS turns that skip into a failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
from support.system import DEBIAN_PACKAGES, REQUIRE_VARIABLE, require_program

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_a_missing_program_skips_naming_its_debian_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # pipx lives in /usr/bin: now not found
    monkeypatch.delenv(REQUIRE_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception) as caught:
        require_program("pipx")
    assert caught.value.msg == "pipx is not installed (Debian: apt-get install pipx)"
    with pytest.raises(pytest.skip.Exception) as caught:
        require_program("python3.11")  # the package build needs its venv module
    assert caught.value.msg == (
        "python3.11 is not installed (Debian: apt-get install python3.11-venv)"
    )


def test_required_system_tests_fail_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception) as caught:
        require_program("wrk")
    assert caught.value.msg == (
        f"wrk is not installed (Debian: apt-get install wrk), and {REQUIRE_VARIABLE} is set"
    )
    monkeypatch.setenv(REQUIRE_VARIABLE, "0")  # "0" and "" do not require
    with pytest.raises(pytest.skip.Exception):
        require_program("wrk")


def test_every_program_a_test_requires_has_its_package() -> None:
    required = set()
    for path in TESTS.rglob("*.py"):
        text = path.read_text()
        required |= set(re.findall(r'require_program\("([^"]+)"\)', text))
        for loop in re.findall(r"for program in \(([^)]*)\):\s*\n\s*require_program", text):
            required |= set(re.findall(r'"([^"]+)"', loop))
    assert {"pipx", "postfix", "smtp-source", "dpkg-deb"} <= required
    assert required <= set(DEBIAN_PACKAGES), required - set(DEBIAN_PACKAGES)


def test_the_readme_and_the_header_say_how_skips_work(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "README.md").read_text()
    tests_section = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert REQUIRE_VARIABLE in tests_section
    for package in set(DEBIAN_PACKAGES.values()):
        assert f"`{package}`" in tests_section, package
    assert REQUIRE_VARIABLE in (conftest.__doc__ or "")
    monkeypatch.setenv(REQUIRE_VARIABLE, "1")
    assert "required" in conftest.pytest_report_header()
    monkeypatch.delenv(REQUIRE_VARIABLE)
    assert "skips" in conftest.pytest_report_header()


@pytest.mark.slow
def test_a_run_without_the_program_prints_the_package_in_its_summary(tmp_path: Path) -> None:
    """What ``make test`` shows on a machine without pipx: the -ra summary line, at the test."""
    case = tmp_path / "test_needs_pipx.py"
    case.write_text(
        "from support.system import require_program\n\n"
        "def test_pipx():\n"
        '    require_program("pipx")\n'
    )
    env = {
        "PATH": str(tmp_path),
        "PYTHONPATH": str(TESTS),
        "HOME": os.environ.get("HOME", str(tmp_path)),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*argv, "-p", "conftest", str(case)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"SKIPPED [1] {case.name}:3: pipx is not installed (Debian: apt-get install pipx)"
        in done.stdout
    ), done.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(case)],
        cwd=tmp_path,
        env={**env, REQUIRE_VARIABLE: "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert failed.returncode == 1, failed.stdout
    assert f"and {REQUIRE_VARIABLE} is set" in failed.stdout


@pytest.mark.slow
def test_the_postgresql_tests_need_postgresql_when_system_tests_are_required(
    tmp_path: Path,
) -> None:
    """Without PostgreSQL's server programs, a test on the private server skips naming the
    package, and fails under MASD_REQUIRE_SYSTEM_TESTS (as CI sets it)."""
    case = tmp_path / "test_needs_postgresql.py"
    case.write_text(
        "import support.postgres\n"
        "from support.postgres import postgres_server  # noqa: F401\n\n"
        "support.postgres.find_bindir = lambda: None  # as on a machine without it\n\n"
        "def test_pg(postgres_server):\n"
        "    pass\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(TESTS), "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", str(case)]
    outcomes = {}
    for required in ("", "1"):
        done = subprocess.run(
            argv,
            cwd=tmp_path,
            env={**env, REQUIRE_VARIABLE: required},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        outcomes[required] = (done.returncode, done.stdout)
    message = "PostgreSQL is not installed (Debian: apt-get install postgresql)"
    assert outcomes[""][0] == 0, outcomes[""][1]
    assert f"SKIPPED [1] {case.name}" in outcomes[""][1]
    assert message in outcomes[""][1]
    assert outcomes["1"][0] == 1, outcomes["1"][1]
    assert f"{message}, and {REQUIRE_VARIABLE} is set" in outcomes["1"][1]
