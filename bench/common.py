"""Shared pieces: child servers with their CPU and RSS (from /proc), ports, percentiles."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """A benchmark could not run or its result failed a check (e.g. a lost message)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(
    port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until something accepts on 127.0.0.1:port (bounded)."""
    until = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"server exited with {proc.returncode} before listening on {port}")
        if time.monotonic() > until:
            raise BenchError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")
        time.sleep(0.02)


# --------------------------------------------------------------------------- /proc


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces.
    return text[text.rindex(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant alive now."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p)
    return seen


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid``, its live descendants and its reaped children."""
    total = 0
    for p in tree(pid):
        fields = _stat(p)
        if fields is None:
            continue
        # After "pid (comm) ": state=0 ... utime=11 stime=12 cutime=13 cstime=14.
        total += sum(int(x) for x in fields[11:15])
    return total / _TICK


def system_seconds(pid: int) -> float:
    """The part of :func:`cpu_seconds` spent in the kernel (system time)."""
    total = 0
    for p in tree(pid):
        fields = _stat(p)
        if fields is not None:
            total += int(fields[12]) + int(fields[14])  # stime, cstime
    return total / _TICK


def switches(pid: int) -> int:
    """Context switches so far of every thread of ``pid`` and its live descendants."""
    total = 0
    for p in tree(pid):
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if "ctxt_switches:" in line:  # voluntary and not
                        total += int(line.split()[1])
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its live descendants."""
    total = 0
    for p in tree(pid):
        try:
            pages = int(Path(f"/proc/{p}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        total += pages * _PAGE
    return total


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A child process serving something on loopback; always stop() it."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    on_stop: list[Callable[[], object]] = field(default_factory=list)

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log: Path,
        port: int,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Server:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd or ROOT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        return cls(name, proc, log, port)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def system(self) -> float:
        return system_seconds(self.pid)

    def switches(self) -> int:
        return switches(self.pid)

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the process group, wait (bounded), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # Children that outlived their leader (none expected) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        while self.on_stop:
            self.on_stop.pop()()
        return self.proc.returncode


# --------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:  # NaN
        return "-"
    return f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b or a != a or b != b:
        return "-"
    return f"{a / b:.2f}x"


# --------------------------------------------------------------------------- the machine


def _first_line(argv: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "-"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "-"


def _dpkg_version(package: str) -> str:
    if shutil.which("dpkg-query") is None:
        return "-"
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "-"


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "-"


def _filesystem(path: Path) -> str:
    best, kind, device = "", "-", "-"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mount, fstype = line.split()[:3]
            if str(path).startswith(mount) and len(mount) >= len(best):
                best, kind, device = mount, fstype, dev
    return f"{kind} on {device}"


def _os_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    return platform.platform()


def commit_floor(workdir: Path, n: int = 300) -> tuple[float, float]:
    """p50 and p99 ms of one-row SQLite commits (WAL, ``synchronous=FULL``) on ``workdir``'s disk.

    The least a durable write costs here: a caller answered only after its
    commit can never be faster than this, whatever masd does.
    """
    path = workdir / "commit-floor.db"
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (x INTEGER)")
        times = []
        for i in range(n):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?)", (i,))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - began)
    finally:
        conn.close()
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
    return 1000 * percentile(times, 50), 1000 * percentile(times, 99)


def masd_revision() -> str:
    """masd's version and when its code was committed, and whether the work tree differs.

    The report names no commit: the date identifies the code in the history.
    """
    from masd import __version__

    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return f"masd {__version__}"
    head = subprocess.run(
        [
            git,
            "-C",
            str(ROOT),
            "log",
            "-1",
            "--date=format-local:%Y-%m-%d %H:%M:%S UTC",
            "--format=committed %cd",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "TZ": "UTC"},
    ).stdout.strip()
    dirty = subprocess.run(
        [git, "-C", str(ROOT), "status", "--porcelain", "--", "masd"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changes = " (+ uncommitted changes in masd/)" if dirty else ""
    return f"masd {__version__}, {head}{changes}"


def machine(workdir: Path) -> dict[str, str]:
    """What the numbers were measured on."""
    from importlib.metadata import PackageNotFoundError, version

    def pkg(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return {
        "cpu": f"{_cpu_model()}, {os.cpu_count()} cores",
        "memory": _memory(),
        "os": f"{_os_name()}, Linux {platform.release()}",
        "disk": f"{_filesystem(workdir)} (store and queues under {workdir})",
        "disk commit floor": "p50 {:.2f} ms, p99 {:.2f} ms per SQLite commit (WAL, "
        "synchronous=FULL, one row, nothing else running in it)".format(*commit_floor(workdir)),
        "masd code": masd_revision(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "sqlite": sqlite3.sqlite_version,
        "python packages": ", ".join(
            f"{n} {pkg(n)}"
            for n in (
                "aiosmtpd",
                "aiohttp",
                "aiosmtplib",
                "cryptography",
                "httpx",
                "sqlite-utils",
                "dkimpy",
            )
        ),
        "postfix (smtp-source, smtp-sink)": _dpkg_version("postfix"),
        "dovecot-lmtpd": _dpkg_version("dovecot-lmtpd"),
        "wrk": _dpkg_version("wrk"),
    }
