"""A private PostgreSQL server on loopback, for tests and demonstrations.

:class:`PostgresServer` runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/<major>/bin``)
on a cluster of its own: ``initdb`` into a fresh temporary directory, a unix socket directory
inside it, TCP on ``127.0.0.1`` at a port picked as :mod:`masd.testing.net` picks them.  The
system's own cluster, if there is one, is never touched.  Run as root, the server runs as the
``postgres`` system user (``initdb`` refuses root).  :meth:`PostgresServer.stop` stops it and
removes the directory; :meth:`~PostgresServer.pause` and :meth:`~PostgresServer.resume`
stop and start it keeping its data (the database down, then back).

The cluster's superuser is ``masd``; on the unix socket it is trusted, on TCP it must give its
password (:attr:`PostgresServer.password`, SCRAM), so a test can exercise both of libpq's ways
in.  Databases are made and dropped by :mod:`masd.store.pg_admin` (SQL lives in the store).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from masd.store.pg_admin import create_database, drop_database
from masd.testing.net import free_port

__all__ = ["PostgresError", "PostgresServer", "find_bindir"]

#: Where Debian installs each major version's server programs.
DEBIAN_ROOT: Final = Path("/usr/lib/postgresql")
#: The account a server started by root runs as (created by Debian's package).
SYSTEM_USER: Final = "postgres"
SUPERUSER: Final = "masd"
_START_TRIES: Final = 3
_TIMEOUT: Final = 60


class PostgresError(Exception):
    """The private server could not be set up, started or stopped."""


def find_bindir(root: Path = DEBIAN_ROOT) -> Path | None:
    """The newest ``<root>/<major>/bin`` holding ``initdb`` and ``pg_ctl``, or None."""
    found = []
    for bindir in root.glob("*/bin"):
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            with contextlib.suppress(ValueError):
                found.append((float(bindir.parent.name), bindir))
    return max(found)[1] if found else None


class PostgresServer:
    """One private server; :meth:`start` it, then :meth:`stop` it (or use ``with``)."""

    def __init__(self, bindir: Path, *, fsync: bool = False) -> None:
        self.bindir = bindir
        #: ``fsync`` on: every commit flushed to disk, as a production server does (a
        #: benchmark's choice); off by default, a throwaway cluster.
        self.fsync = fsync
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.root: Path | None = None
        self._account: pwd.struct_passwd | None = None
        self._running = False

    # -- where it is ---------------------------------------------------------------------

    @property
    def socket_dir(self) -> Path:
        return self._root() / "run"

    def uri(self, database: str = "postgres") -> str:
        """The libpq URI of ``database`` over TCP on loopback (the password is separate)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def socket_uri(self, database: str = "postgres") -> str:
        """The libpq URI of ``database`` over the unix socket (trusted: no password)."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"

    # -- databases -----------------------------------------------------------------------

    def create_database(self, name: str) -> str:
        """Create the empty database ``name``; return its TCP URI."""
        create_database(self.socket_uri(), name)
        return self.uri(name)

    def drop_database(self, name: str) -> None:
        drop_database(self.socket_uri(), name)

    # -- life ----------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        if self._running:
            return self
        self._account = _account()
        self.root = Path(tempfile.mkdtemp(prefix="masd-pg-"))
        try:
            self._initdb()
            self._listen()
        except BaseException:
            self._remove()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        try:
            if self._running:
                self._run("pg_ctl", "-D", str(self._root() / "data"), "-m", "fast", "-w", "stop")
                self._running = False
        finally:
            self._remove()

    def pause(self) -> None:
        """Stop the server (fast shutdown: every session is ended) and keep its data."""
        if self._running:
            self._run("pg_ctl", "-D", str(self._root() / "data"), "-m", "fast", "-w", "stop")
            self._running = False

    def resume(self) -> None:
        """Start a paused server again, on the port it had."""
        if not self._running:
            self._start_on(self.port)
            self._running = True

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- steps ---------------------------------------------------------------------------

    def _initdb(self) -> None:
        root = self._root()
        self._own(root)
        self.socket_dir.mkdir(mode=0o700)
        self._own(self.socket_dir)
        pwfile = root / "superuser.password"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        self._own(pwfile)
        self._run(
            "initdb",
            "--pgdata",
            str(root / "data"),
            "--username",
            SUPERUSER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        )
        pwfile.unlink()

    def _listen(self) -> None:
        """Start on a free loopback port; another pick if the port was taken meanwhile."""
        for attempt in range(_START_TRIES):
            self.port = free_port()
            try:
                self._start_on(self.port)
            except PostgresError:
                if attempt == _START_TRIES - 1:
                    raise
                continue
            self._running = True
            return

    def _start_on(self, port: int) -> None:
        root = self._root()
        durability = (
            "-c fsync=on -c full_page_writes=on -c synchronous_commit=on"
            if self.fsync
            else "-c fsync=off -c full_page_writes=off"  # a throwaway cluster: no crash safety
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -c unix_socket_directories={self.socket_dir} "
            f"{durability}"
        )
        self._run(
            "pg_ctl",
            *("-D", str(root / "data"), "-l", str(root / "server.log")),
            *("-w", "-t", str(_TIMEOUT), "-o", f"{options} -p {port}", "start"),
        )

    def _run(self, program: str, *args: str) -> None:
        account = self._account
        try:
            done = subprocess.run(
                [str(self.bindir / program), *args],
                cwd=self._root(),
                user=account.pw_uid if account else None,
                group=account.pw_gid if account else None,
                extra_groups=[] if account else None,
                env={"PATH": os.defpath, "LC_ALL": "C", "HOME": str(self._root())},
                capture_output=True,
                text=True,
                timeout=_TIMEOUT + 10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresError(f"{program}: {exc}") from exc
        if done.returncode != 0:
            log = self._root() / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise PostgresError(
                f"{program} {' '.join(args[-1:])} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()}\n{tail}".rstrip()
            )

    def _own(self, path: Path) -> None:
        if self._account is not None:
            os.chown(path, self._account.pw_uid, self._account.pw_gid)

    def _root(self) -> Path:
        if self.root is None:
            raise PostgresError("the server is not started")
        return self.root

    def _remove(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _account() -> pwd.struct_passwd | None:
    """Who runs the server: None for the current user, the system user when that is root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise PostgresError(
            f"running as root, and there is no {SYSTEM_USER!r} user to run PostgreSQL as "
            "(initdb refuses root; Debian's postgresql package creates the user)"
        ) from None
