"""masd's test suite: real sockets on loopback, real SQLite files, real system programs.

Some tests drive system programs (Postfix, systemd-analyze, dpkg-deb, pipx,
smtp-source, ...).  Where one is missing the test is skipped, and its line in
pytest's summary names the test and the Debian package that would run it
(``tests/support/system.py`` holds the table; ``.ci/setup.d/*.sh`` install
them all).

``MASD_REQUIRE_SYSTEM_TESTS=1`` turns each such skip into a failure, so a run
cannot pass by skipping: ``.ci/run`` sets it.  The header of every run says
which of the two applies.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import settings
from support.system import REQUIRE_VARIABLE, system_tests_required

# Hypothesis's per-example deadline is a timed assertion: on a loaded machine (CI, the
# suite on every core) it fails tests that are only slow.  Speed is measured by the
# benchmarks instead.
settings.register_profile("masd", deadline=None)
settings.load_profile("masd")

SUPPORT = Path(__file__).resolve().parent / "support"


def pytest_report_header() -> str:
    if system_tests_required():
        return f"system tests: required ({REQUIRE_VARIABLE} is set): a missing program fails"
    return (
        "system tests: a missing program skips its test, naming the Debian package "
        f"({REQUIRE_VARIABLE}=1 fails instead)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A skip raised by a helper in support/ is reported at the test it skipped, so the
    summary line names the test, not the helper."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple):
        path, _, reason = report.longrepr
        if Path(path).resolve().parent == SUPPORT:
            location, line = item.reportinfo()[:2]
            report.longrepr = (os.fspath(location), (line or 0) + 1, reason)
    return report
