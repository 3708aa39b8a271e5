"""System programs the tests drive for real (postfix, systemd-analyze, dpkg-deb, pipx,
PostgreSQL).

One rule, in one place: a missing program skips the test, and the skip names
the Debian package that brings it; unless ``MASD_REQUIRE_SYSTEM_TESTS`` is set
(as ``.ci/run`` does), in which case it fails the test, so CI cannot pass by
skipping.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

#: Set (to anything but "" or "0") to turn a missing program into a failure.
REQUIRE_VARIABLE = "MASD_REQUIRE_SYSTEM_TESTS"
#: Where programs for root live, searched too: tests may run as a user whose
#: PATH lacks them.
_SBIN = ("/usr/sbin", "/sbin")
#: Each program a test may require, and the Debian 12 package that installs it
#: (the scripts in .ci/setup.d/ install them all).
DEBIAN_PACKAGES = {
    "postfix": "postfix",
    "postconf": "postfix",
    "postqueue": "postfix",
    "smtp-source": "postfix",
    "smtp-sink": "postfix",
    "wrk": "wrk",
    "dovecot": "dovecot-lmtpd",
    "systemd-analyze": "systemd",
    "systemd-socket-activate": "systemd",
    "dpkg-deb": "dpkg",
    "python3.11": "python3.11-venv",
    "pipx": "pipx",
    "make": "make",
    "miltertest": "miltertest",
    "opendkim": "opendkim",
    "opendmarc": "opendmarc",
    "dnsmasq": "dnsmasq-base",
    "openssl": "openssl",
    "unshare": "util-linux",
    "promtool": "prometheus",
    "haproxy": "haproxy",
    # Not on PATH: support/postgres.py finds them under /usr/lib/postgresql/<major>/bin.
    "initdb": "postgresql",
    "pg_ctl": "postgresql",
    "s-nail": "s-nail",
    "mutt": "mutt",
    "mpack": "mpack",
    "uuencode": "sharutils",
    "tnef": "tnef",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
}


def system_tests_required() -> bool:
    return os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0")


def require_program(name: str) -> str:
    """The path of program ``name``; skip the test (or fail it, when required) if missing."""
    package = DEBIAN_PACKAGES[name]  # a KeyError here: add the program to the table
    path = shutil.which(name)
    if path is None:
        extra = os.pathsep.join(_SBIN)
        path = shutil.which(name, path=extra)
    if path is not None:
        return path
    missing(name, package)


def missing(what: str, package: str) -> NoReturn:
    """Skip the test (or fail it, when required): ``what`` is not installed."""
    message = f"{what} is not installed (Debian: apt-get install {package})"
    if system_tests_required():
        pytest.fail(f"{message}, and {REQUIRE_VARIABLE} is set", pytrace=False)
    pytest.skip(message)
