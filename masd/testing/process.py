"""Programs as child processes: masd itself, or any target a rig starts.

:class:`ChildProcess` runs a command with its output appended to a log file
and stops it bounded (SIGTERM or SIGKILL, then SIGKILL after a timeout).
Every child started and not yet reaped is in :data:`LIVE`, so a rig that is
interrupted can :func:`reap_all` and leave none behind.

:class:`MasdProcess` is ``python -m masd serve --config FILE``: it waits for
the ``READY=1`` datagram masd sends to ``$NOTIFY_SOCKET`` (a socket created
here).  Inside ``async with MasdProcess(config, log) as masd:`` a failure
prints masd's log, so pytest shows it with the failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "LIVE",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "ChildProcess",
    "MasdProcess",
    "MasdStartError",
    "ProcessStuck",
    "child_env",
    "reap_all",
]

#: Bounds (real seconds) of starting and of stopping a child.
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
_POLL = 0.02
_SYSTEMD_VARIABLES = frozenset({"NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"})

#: Every child started and not yet reaped.
LIVE: set[subprocess.Popen[bytes]] = set()


class ProcessStuck(RuntimeError):
    """A child did not exit within the bound after SIGTERM (it has been killed)."""


class MasdStartError(RuntimeError):
    """masd did not become ready; the message carries its log."""


def child_env(*, this_masd: bool) -> dict[str, str]:
    """This process's environment for a child, less systemd's socket-activation and
    notify variables, unbuffered; with ``this_masd``, the folder holding this
    masd package first on ``PYTHONPATH`` (so ``python -m masd`` runs this one)."""
    env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    if this_masd:
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def reap_all() -> None:
    """Kill and reap every child still in :data:`LIVE`."""
    for proc in list(LIVE):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
        LIVE.discard(proc)


class ChildProcess:
    """``argv`` as a child process; stdout and stderr appended to ``log``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log
        self.cwd = cwd
        self.env = dict(child_env(this_masd=False) if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        """Start the child (it is not waited for)."""
        with self.log_path.open("ab") as log:
            log.write(f"==== {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
            )
        LIVE.add(self.proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    async def stop(self, *, kill: bool = False, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (or SIGKILL) and wait; the exit code.  :class:`ProcessStuck`
        (after a SIGKILL) when it has not exited within ``timeout`` seconds."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while (code := proc.poll()) is None:
            if loop.time() > until:
                self.kill()
                raise ProcessStuck(f"{self.argv[0]} did not exit within {timeout:g} s of SIGTERM")
            await asyncio.sleep(_POLL)
        LIVE.discard(proc)
        return code

    def kill(self) -> None:
        """SIGKILL (``kill -9``) and reap."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
        if proc is not None:
            LIVE.discard(proc)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class MasdProcess(ChildProcess):
    """``masd serve --config FILE`` as a child process, ready when it says ``READY=1``.

    Use ``async with MasdProcess(config, log) as masd:``; leaving the block
    kills a process that is still running.  The waits are async so that fake
    peers in the same event loop keep answering while masd starts or stops.
    """

    def __init__(
        self, config: Path, log_path: Path, *, cwd: Path | None = None, args: Sequence[str] = ()
    ) -> None:
        """``args``: more ``masd serve`` options (``--pid-file FILE``)."""
        argv = [sys.executable, "-m", "masd", "serve", "--config", str(config), *args]
        super().__init__(
            argv, log=log_path, cwd=cwd or config.parent, env=child_env(this_masd=True)
        )
        self.config = config
        self.starts = 0
        self._sock_dir: str | None = None
        self._sock: socket.socket | None = None

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start masd and wait until it says ``READY=1`` (bounded by ``timeout``)."""
        if self.running:
            raise RuntimeError("masd is already running")
        sock = self._notify_socket()
        self.env["NOTIFY_SOCKET"] = str(sock.getsockname())
        self.starts += 1
        self.spawn()
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                data = b""
            if b"READY=1" in data.split(b"\n"):
                return
            code = self.exit_code()
            if code is not None:
                raise MasdStartError(f"masd exited with {code} before READY=1\n{self.log()}")
            if loop.time() > until:
                self.kill()
                raise MasdStartError(f"masd sent no READY=1 within {timeout:g} s\n{self.log()}")
            await asyncio.sleep(_POLL)

    async def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then wait (bounded) for the exit code."""
        if not self.running:
            raise RuntimeError("masd is not running")
        try:
            return await self.stop(timeout=timeout)
        except ProcessStuck as exc:
            raise ProcessStuck(f"{exc}\n{self.log()}") from None

    async def __aenter__(self) -> MasdProcess:
        try:
            await self.start()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kill()
        self.close()
        if exc[1] is not None:
            print(f"---- masd log ({self.log_path}) ----\n{self.log()}")

    def close(self) -> None:
        """Remove the notify socket (after the last start)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    def _notify_socket(self) -> socket.socket:
        if self._sock is not None:
            with contextlib.suppress(BlockingIOError):  # drop what the previous run said
                while self._sock.recv(4096):
                    pass
            return self._sock
        # A short directory: a unix socket path must fit in 107 bytes.
        self._sock_dir = tempfile.mkdtemp(prefix="masd-n-")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(Path(self._sock_dir) / "notify"))
        sock.setblocking(False)
        self._sock = sock
        return sock
