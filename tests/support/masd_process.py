"""masd as a real process for black-box tests: config files, start, readiness, stop.

``MasdProcess`` runs ``python -m masd serve --config FILE``, waits for the
``READY=1`` datagram masd sends to ``$NOTIFY_SOCKET`` (a socket created
here), and stops it with SIGTERM (expecting exit 0) or SIGKILL.  Its
stdout and stderr go to a log file; when a test fails inside
``async with MasdProcess(...)`` the log is printed, so pytest shows it with
the failure.

``write_master_config`` writes a master-role configuration with its token
files (mode 0600): LMTP and HTTP on loopback at ports that were free a
moment ago (the HTTP port must be known up front: it is in ``status_url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import email.utils
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "help.example"
AUTHSERV_ID = "mx.help.example"
WAIT = 15.0  # the bound of every wait for something masd does on its own


async def wait_until(test: Callable[[], bool], what: str) -> None:
    """Poll ``test`` until it holds, at most :data:`WAIT` seconds."""
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT
    while not test():
        if loop.time() > until:
            raise AssertionError(f"{what}: not within {WAIT:g} s")
        await asyncio.sleep(0.05)


def mx_mail(
    sender: str,
    to: str,
    *,
    subject: str = "Help, please",
    body: str = "Hello.\n",
    dmarc: str | None = "pass",
    authserv_id: str = AUTHSERV_ID,
    headers: dict[str, str] | None = None,
    in_reply_to: str | None = None,
) -> tuple[str, bytes]:
    """A mail as our MX hands it over: A-R (when ``dmarc``) and Received by our MX on top.

    Returns its Message-ID and its bytes.
    """
    domain = sender.rsplit("@", 1)[1]
    message_id = f"<{secrets.token_hex(8)}@{domain}>"
    msg = EmailMessage(policy=email.policy.SMTP)
    if dmarc is not None:
        msg["Authentication-Results"] = f"{authserv_id}; dmarc={dmarc} header.from={domain}"
    msg["Received"] = f"from mail.{domain} by {AUTHSERV_ID} with ESMTPS; " + (
        email.utils.formatdate(usegmt=True)
    )
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id
    if in_reply_to is not None:
        msg["In-Reply-To"] = in_reply_to
        msg["References"] = in_reply_to
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(body)
    return message_id, msg.as_bytes()


START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")


@dataclass(frozen=True)
class MasterSetup:
    """A written master-role configuration and what a test needs to talk to masd."""

    config: Path
    lmtp_port: int
    http_port: int
    admin_token: str
    endpoint_token: str

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def messages_url(self) -> str:
        return f"{self.http_url}/mas/v0.1/messages"


def server_section(smtp_port: int, retry_for: str) -> tuple[str, int, int]:
    """The ``[server]`` table of a test config on free loopback ports, and the ports."""
    lmtp_port, http_port = free_port(), free_port()
    while http_port == lmtp_port:
        http_port = free_port()
    text = f"""\
[server]
lmtp = "127.0.0.1:{lmtp_port}"
http = "127.0.0.1:{http_port}"
database = "masd.db"
smtp_relay = "127.0.0.1:{smtp_port}"
trusted_authserv_ids = ["{AUTHSERV_ID}"]
admin_token_file = "secrets/admin.token"
retry_for = "{retry_for}"
"""
    return text, lmtp_port, http_port


def write_master_config(
    directory: Path,
    *,
    endpoint_url: str,
    smtp_port: int,
    deadline: str = "1h",
    modes: Sequence[str] = ("callback", "chat"),
    fields: Sequence[str] = ("phone", "time"),
    retry_for: str = "1h",
) -> MasterSetup:
    """``directory/masd.toml``: type ``ticket`` (master) of ``help.example``.

    ``callback`` goes to ``endpoint_url``; every other mode in ``modes`` is
    listed without an endpoint.
    """
    directory.mkdir(parents=True, exist_ok=True)
    admin_token = "admin-" + secrets.token_hex(16)
    endpoint_token = "callback-" + secrets.token_hex(16)
    write_secret(directory / "secrets" / "admin.token", admin_token)
    write_secret(directory / "secrets" / "callback.token", endpoint_token)
    server, lmtp_port, http_port = server_section(smtp_port, retry_for)
    mode_list = ", ".join(f'"{m}"' for m in modes)
    field_list = ", ".join(f'"{f}"' for f in fields)
    text = (
        server
        + f"""
[domains."{DOMAIN}".types.ticket]
role = "master"
modes = [{mode_list}]
"""
    )
    if "callback" in modes:
        text += f"""
[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "{endpoint_url}"
token_file = "secrets/callback.token"
deadline = "{deadline}"
fields = [{field_list}]
"""
    config = directory / "masd.toml"
    config.write_text(text)
    return MasterSetup(config, lmtp_port, http_port, admin_token, endpoint_token)


class MasdStartError(RuntimeError):
    """masd did not become ready; the message carries its log."""


class MasdProcess:
    """``masd serve --config FILE`` as a child process.

    Use ``async with MasdProcess(config, log) as masd:``; leaving the block
    kills a process that is still running.  The waits are async so that fake
    peers in the same event loop keep answering while masd starts or stops.
    """

    def __init__(self, config: Path, log_path: Path, *, args: Sequence[str] = ()) -> None:
        """``args``: more options of ``masd serve`` (``--test-clock``)."""
        self.config = config
        self.log_path = log_path
        self.args = tuple(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock_dir: str | None = None
        self._sock: socket.socket | None = None
        self.starts = 0

    # ---- lifecycle

    async def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start masd and wait until it says ``READY=1`` (bounded by ``timeout``)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("masd is already running")
        self._open_notify_socket()
        assert self._sock is not None
        assert self._sock_dir is not None
        env = dict(os.environ)
        env["NOTIFY_SOCKET"] = str(Path(self._sock_dir) / "notify")
        env["PYTHONUNBUFFERED"] = "1"
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"==== start {self.starts}: masd serve --config {self.config}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "masd", "serve", "--config", str(self.config), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=env,
            )
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while True:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                data = b""
            if b"READY=1" in data.split(b"\n"):
                return
            code = self.proc.poll()
            if code is not None:
                raise MasdStartError(f"masd exited with {code} before READY=1\n{self.log()}")
            if loop.time() > until:
                self.kill()
                raise MasdStartError(f"masd sent no READY=1 within {timeout:g} s\n{self.log()}")
            await asyncio.sleep(0.02)

    async def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then wait (bounded) for the exit code."""
        proc = self._running()
        proc.send_signal(signal.SIGTERM)
        return await self._wait(proc, timeout)

    def kill(self) -> None:
        """SIGKILL (``kill -9``) and reap."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # ---- context manager

    async def __aenter__(self) -> MasdProcess:
        try:
            await self.start()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill()
        self.close()
        if exc is not None:
            print(f"---- masd log ({self.log_path}) ----\n{self.log()}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    # ---- internals

    def _open_notify_socket(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(BlockingIOError):  # drop what the previous run said
                while self._sock.recv(4096):
                    pass
            return
        # A short directory: a unix socket path must fit in 107 bytes.
        self._sock_dir = tempfile.mkdtemp(prefix="masd-n-")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(Path(self._sock_dir) / "notify"))
        sock.setblocking(False)
        self._sock = sock

    def _running(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError("masd is not running")
        return self.proc

    async def _wait(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while (code := proc.poll()) is None:
            if loop.time() > until:
                proc.kill()
                proc.wait()
                raise AssertionError(f"masd did not exit within {timeout:g} s\n{self.log()}")
            await asyncio.sleep(0.02)
        return code
