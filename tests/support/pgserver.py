"""A private PostgreSQL server for the store's backend tests: unix socket only, trust auth.

``pg_server`` (module-scoped) runs one server from a temporary directory, as
``postgres`` when the tests run as root, and removes it after; ``fresh_database``
creates an empty database on it and returns its URI.  Without PostgreSQL the test
is skipped naming the Debian package (or fails under ``MASD_REQUIRE_SYSTEM_TESTS``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.system import require_program

_names = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """The URI of the server's ``postgres`` database (user ``masd``, over its socket)."""
    bindir = Path(require_program("initdb")).resolve().parent
    top = Path(tempfile.mkdtemp(prefix="masd-pg-"))
    data, sock = top / "data", top / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(sock, "postgres")
    port = free_port()
    ctl = str(bindir / "pg_ctl")
    _run(_as_postgres([str(bindir / "initdb"), "-U", "masd", "-A", "trust", "-D", str(data)]))
    opts = f"-c listen_addresses='' -k {sock} -p {port} -c fsync=off"
    _run(_as_postgres([ctl, "-D", str(data), "-o", opts, "-w", "start", "-l", str(top / "log")]))
    try:
        yield f"postgresql:///postgres?host={sock}&port={port}&user=masd"
    finally:
        subprocess.run(
            _as_postgres([ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(top, ignore_errors=True)


def fresh_database(server: str) -> str:
    """A new empty database on ``server``; its URI."""
    import psycopg

    name = f"masd_{os.getpid()}_{next(_names)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.replace("/postgres?", f"/{name}?", 1)
