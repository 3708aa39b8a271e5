"""Socket activation (sd_listen_fds(3)): masd serves the sockets it is passed.

The parsing rules are checked in-process; serving is checked with masd as a
real process, started the way a service manager does it: listening sockets
at descriptors 3, 4, ..., ``LISTEN_PID`` set to masd's own pid, and
``LISTEN_FDS`` / ``LISTEN_FDNAMES`` describing them.  The launcher is a
small Python program that arranges the descriptors and then execs masd (so
its pid is masd's); the last test uses systemd's own
``systemd-socket-activate``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest
from support.masd_process import ROOT, free_port, write_master_config
from support.system import require_program

from masd.edges.sockets import (
    SD_LISTEN_FDS_START,
    SocketActivationError,
    adopt,
    inherited_sockets,
    parse_listen_env,
)
from masd.testing import lmtpclient

WAIT = 20.0
MAIL = (
    b"From: ann@example.org\r\nTo: ticket@help.example\r\nSubject: socket activation\r\n"
    b"Message-ID: <sa-1@example.org>\r\n\r\nHello.\r\n"
)

# --------------------------------------------------------------------------- parsing


def env(pid: int = 42, fds: str | None = "2", names: str | None = "lmtp:http") -> dict[str, str]:
    found = {"LISTEN_PID": str(pid)}
    if fds is not None:
        found["LISTEN_FDS"] = fds
    if names is not None:
        found["LISTEN_FDNAMES"] = names
    return found


def test_names_map_to_descriptors_from_three() -> None:
    pairs = parse_listen_env(env(names="http:lmtp"), 42)
    assert pairs == ((3, "http"), (4, "lmtp"))
    assert SD_LISTEN_FDS_START == 3


def test_all_three_listener_names_are_known() -> None:
    assert parse_listen_env(env(fds="3", names="policy:lmtp:http"), 42) == (
        (3, "policy"),
        (4, "lmtp"),
        (5, "http"),
    )


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"LISTEN_FDS": "1", "LISTEN_FDNAMES": "lmtp"},  # no LISTEN_PID
        {"LISTEN_PID": "42"},  # no LISTEN_FDS
        env(pid=41),  # meant for another process (inherited environment)
        env(fds="0", names=""),
    ],
)
def test_not_activated(environ: dict[str, str]) -> None:
    assert parse_listen_env(environ, 42) == ()


@pytest.mark.parametrize(
    ("environ", "path", "words"),
    [
        (env(pid=0), "LISTEN_PID", "'0' is not a process id"),
        ({"LISTEN_PID": "x", "LISTEN_FDS": "1"}, "LISTEN_PID", "'x' is not a process id"),
        (env(fds="-1"), "LISTEN_FDS", "'-1' is not a number"),
        (env(fds="two"), "LISTEN_FDS", "'two' is not a number"),
        (env(names=None), "LISTEN_FDNAMES", "name each of the 2 sockets"),
        (env(names="lmtp"), "LISTEN_FDNAMES", "has 1 names for 2 sockets"),
        (env(names="lmtp:smtp"), "LISTEN_FDNAMES", "socket 4 is named 'smtp'"),
        (env(names="lmtp:masd-http.socket"), "LISTEN_FDNAMES", "set FileDescriptorName="),
        (env(names="lmtp:lmtp"), "LISTEN_FDNAMES", "socket 4 is named 'lmtp' like an earlier"),
    ],
)
def test_refusals_name_the_variable_and_the_value(
    environ: dict[str, str], path: str, words: str
) -> None:
    with pytest.raises(SocketActivationError) as caught:
        parse_listen_env(environ, 42)
    assert caught.value.path == path
    assert words in caught.value.detail
    assert caught.value.code == "socket-activation"
    assert str(caught.value).startswith(f"{path}: ")


def test_inherited_sockets_clears_the_variables() -> None:
    environ = env(pid=41)
    environ["OTHER"] = "kept"
    assert inherited_sockets(environ, pid=42) == {}
    assert environ == {"OTHER": "kept"}


# --------------------------------------------------------------------------- adopting


@contextmanager
def unix_listener() -> Iterator[tuple[socket.socket, str]]:
    directory = tempfile.mkdtemp(prefix="masd-s-")
    path = os.path.join(directory, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen()
        yield sock, path
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(directory)


def test_adopt_a_listening_unix_socket() -> None:
    with unix_listener() as (original, path):
        fd = os.dup(original.fileno())
        os.set_inheritable(fd, True)
        adopted = adopt(fd, "lmtp")
        try:
            assert adopted.fileno() == fd
            assert adopted.family == socket.AF_UNIX
            assert adopted.getsockname() == path
            assert not adopted.get_inheritable()
        finally:
            adopted.close()


def test_adopt_a_listening_tcp_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as original:
        original.bind(("127.0.0.1", 0))
        original.listen()
        adopted = adopt(os.dup(original.fileno()), "http")
        with adopted:
            assert adopted.getsockname() == original.getsockname()


@contextmanager
def refused_fd(kind: str) -> Iterator[int]:
    if kind == "file":
        with tempfile.TemporaryFile() as handle:
            yield handle.fileno()
    elif kind == "datagram":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            yield sock.fileno()
    elif kind == "not listening":
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            yield sock.fileno()
    else:
        read, write = os.pipe()
        os.close(read)
        os.close(write)
        yield read


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("file", "is not a socket"),
        ("datagram", "is not a stream socket"),
        ("not listening", "is not listening"),
        ("closed", "is not open"),
    ],
)
def test_adopt_refuses_what_cannot_be_served(kind: str, words: str) -> None:
    with refused_fd(kind) as fd:
        with pytest.raises(SocketActivationError) as caught:
            adopt(fd, "lmtp")
        assert f"socket {fd} (lmtp) {words}" in caught.value.detail
        if kind != "closed":
            os.fstat(fd)  # the refused descriptor is left open, not closed behind its owner


# --------------------------------------------------------------------------- masd, activated

# Puts the descriptors named in argv[1] at 3, 4, ..., sets LISTEN_PID to its
# own pid, and execs masd with the rest of argv (the pid stays the same).
LAUNCHER = """\
import os, sys
fds = [int(fd) for fd in sys.argv[1].split(",") if fd]
for index, fd in enumerate(fds):
    os.dup2(fd, 3 + index)
for fd in fds:
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.executable, [sys.executable, "-m", "masd", *sys.argv[2:]])
"""


def high_fd(sock: socket.socket) -> int:
    """A copy of ``sock``'s descriptor at 10 or above, clear of 3, 4, 5."""
    return fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)


@asynccontextmanager
async def activated(
    config: Path,
    passed: Sequence[tuple[str, socket.socket]],
    log: Path,
    *,
    names: str | None = None,
    ready: bool = True,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """``masd serve`` with ``passed`` as its sockets; waits for READY=1 if ``ready``."""
    fds = [high_fd(sock) for _, sock in passed]
    notify_dir = tempfile.mkdtemp(prefix="masd-n-")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(notify_dir, "notify"))
    notify.setblocking(False)
    environ = dict(os.environ)
    environ.update(
        NOTIFY_SOCKET=os.path.join(notify_dir, "notify"),
        LISTEN_FDS=str(len(passed)),
        LISTEN_FDNAMES=names if names is not None else ":".join(n for n, _ in passed),
        PYTHONUNBUFFERED="1",
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                LAUNCHER,
                ",".join(map(str, fds)),
                "serve",
                "--config",
                f"{config}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=environ,
            pass_fds=fds,
        )
    for fd in fds:
        os.close(fd)
    try:
        if ready:
            until = asyncio.get_running_loop().time() + WAIT
            while True:
                try:
                    said = notify.recv(4096)
                except BlockingIOError:
                    said = b""
                if b"READY=1" in said.split(b"\n"):
                    break
                assert proc.poll() is None, f"masd exited early:\n{log.read_text()}"
                assert asyncio.get_running_loop().time() < until, log.read_text()
                await asyncio.sleep(0.02)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=WAIT)
        notify.close()
        os.unlink(os.path.join(notify_dir, "notify"))
        os.rmdir(notify_dir)


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    until = asyncio.get_running_loop().time() + WAIT
    while (code := proc.poll()) is None:
        assert asyncio.get_running_loop().time() < until, "masd did not exit"
        await asyncio.sleep(0.02)
    return code


def masd_serve(config: Path) -> list[str]:
    return [sys.executable, "-m", "masd", "serve", "--config", str(config)]


def master_config(directory: Path) -> Path:
    # Nothing listens at the endpoint or the relay: the test is about the listeners.
    return write_master_config(
        directory, endpoint_url="http://127.0.0.1:9/mas", smtp_port=free_port()
    ).config


@pytest.mark.slow
def test_masd_serves_the_passed_sockets_and_binds_nothing_itself(tmp_path: Path) -> None:
    asyncio.run(_masd_serves_the_passed_sockets_and_binds_nothing_itself(tmp_path))


async def _masd_serves_the_passed_sockets_and_binds_nothing_itself(tmp_path: Path) -> None:
    config = master_config(tmp_path / "conf")
    configured_lmtp = int(config.read_text().split('lmtp = "127.0.0.1:')[1].split('"')[0])
    with unix_listener() as (lmtp_sock, lmtp_path), socket.socket() as http_sock:
        http_sock.bind(("127.0.0.1", 0))
        http_sock.listen()
        http_port = http_sock.getsockname()[1]
        passed = [("lmtp", lmtp_sock), ("http", http_sock)]
        async with activated(config, passed, tmp_path / "masd.log") as proc:
            result = await lmtpclient.deliver(
                lmtp_path, "ann@example.org", ["ticket@help.example"], MAIL
            )
            assert result.codes == (250,), result
            async with httpx.AsyncClient() as client:
                health = await client.get(f"http://127.0.0.1:{http_port}/healthz")
            assert health.status_code == 200
            # The [server] addresses were not bound: the passed sockets replace them.
            with pytest.raises(ConnectionRefusedError), socket.socket() as probe:
                probe.connect(("127.0.0.1", configured_lmtp))
            proc.send_signal(signal.SIGTERM)
            assert await wait_exit(proc) == 0
        # The socket is the service manager's: still there, still listening, and
        # a connection made now waits for the next masd (as with systemd).
        assert os.path.exists(lmtp_path)
        with socket.socket(socket.AF_UNIX) as late:
            late.connect(lmtp_path)


@pytest.mark.slow
def test_only_lmtp_passed_http_is_bound_from_the_config(tmp_path: Path) -> None:
    asyncio.run(_only_lmtp_passed_http_is_bound_from_the_config(tmp_path))


async def _only_lmtp_passed_http_is_bound_from_the_config(tmp_path: Path) -> None:
    config = master_config(tmp_path / "conf")
    http_port = int(config.read_text().split('http = "127.0.0.1:')[1].split('"')[0])
    with unix_listener() as (lmtp_sock, lmtp_path):
        async with activated(config, [("lmtp", lmtp_sock)], tmp_path / "masd.log") as proc:
            result = await lmtpclient.deliver(
                lmtp_path, "ann@example.org", ["ticket@help.example"], MAIL
            )
            assert result.codes == (250,)
            async with httpx.AsyncClient() as client:
                health = await client.get(f"http://127.0.0.1:{http_port}/healthz")
            assert health.status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert await wait_exit(proc) == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("names", "words"),
    [
        ("smtp", "socket 3 is named 'smtp'; masd serves only lmtp, http, policy"),
        ("lmtp:http", "has 2 names for 1 sockets"),
    ],
)
def test_a_socket_masd_cannot_serve_stops_the_start(tmp_path: Path, names: str, words: str) -> None:
    asyncio.run(_a_socket_masd_cannot_serve_stops_the_start(tmp_path, names, words))


async def _a_socket_masd_cannot_serve_stops_the_start(
    tmp_path: Path, names: str, words: str
) -> None:
    config = master_config(tmp_path / "conf")
    log = tmp_path / "masd.log"
    with unix_listener() as (sock, _):
        async with activated(config, [("lmtp", sock)], log, names=names, ready=False) as proc:
            assert await wait_exit(proc) != 0
    text = log.read_text()
    assert "LISTEN_FDNAMES" in text
    assert words in text
    assert "Traceback" not in text  # a one-line refusal, not a crash
    assert not (tmp_path / "conf" / "masd.db").exists()  # refused before the store opened


@pytest.mark.slow
@pytest.mark.system
def test_systemd_socket_activate_starts_masd_on_the_first_connection(
    tmp_path: Path,
) -> None:
    asyncio.run(_systemd_socket_activate_starts_masd_on_the_first_connection(tmp_path))


async def _systemd_socket_activate_starts_masd_on_the_first_connection(
    tmp_path: Path,
) -> None:
    tool = require_program("systemd-socket-activate")
    config = master_config(tmp_path / "conf")
    directory = tempfile.mkdtemp(prefix="masd-a-")
    lmtp_path = os.path.join(directory, "lmtp")
    log = tmp_path / "masd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [tool, "--listen", lmtp_path, "--fdname=lmtp", "-E", "PYTHONPATH", *masd_serve(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        until = asyncio.get_running_loop().time() + WAIT
        while not os.path.exists(lmtp_path):
            assert proc.poll() is None, log.read_text()
            assert asyncio.get_running_loop().time() < until, log.read_text()
            await asyncio.sleep(0.02)
        # This connection starts masd; it waits in the backlog until masd accepts it.
        result = await lmtpclient.deliver(
            lmtp_path, "ann@example.org", ["ticket@help.example"], MAIL, timeout=WAIT
        )
        assert result.codes == (250,), log.read_text()
        assert "ready lmtp=" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.exists(lmtp_path):
            os.unlink(lmtp_path)
        os.rmdir(directory)
