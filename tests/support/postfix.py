"""A private Postfix instance for end-to-end tests, configured from packaging/postfix/.

``PostfixInstance`` builds a Postfix configuration directory, queue and data
directory under ``/var/tmp`` (``maillog_file`` must be under one of
``maillog_file_prefixes``, ``/var`` by default), starts it with
``postfix -c DIR start`` and stops it with ``postfix -c DIR stop``.  The
system's own instance (``/etc/postfix``) is neither read nor touched.

The configuration is what an operator gets from the README's Postfix
section, plus test-only settings:

- ``main.cf``: test settings (loopback only, the queue and data directory,
  ``relayhost`` pointing at the test's SMTP sink, nothing delivered locally),
  then ``packaging/postfix/main.cf.snippet`` verbatim, then the two site
  values (``masd_lmtp``, ``masd_policy``) set with ``postconf -e`` exactly as
  the README tells the operator to;
- ``master.cf``: the distribution's ``master.cf.proto`` with the ``smtp``
  service moved to a loopback port and every service out of the chroot (a
  chroot in a temporary queue directory lacks the files Debian's init script
  copies into ``/var/spool/postfix``), then ``packaging/postfix/
  master.cf.snippet`` verbatim;
- ``masd_header_checks``: ``packaging/postfix/header_checks`` verbatim;
- a test-only header table standing in for the authenticator of a real MX
  (a DMARC milter): a header ``X-Test-Authenticated: <results>`` gets
  ``Authentication-Results: mx.help.example; <results>`` prepended.  Text
  prepended by a header_checks rule is not itself inspected, just as headers
  a milter adds are not (those go through ``milter_header_checks``), so it
  survives the shipped table, which removes every other header naming the
  trusted authserv-id.

Postfix must run as root (it drops to the ``postfix`` user itself);
:func:`require_postfix` skips, or fails under ``MASD_REQUIRE_SYSTEM_TESTS``,
when it cannot run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import smtplib
import socket
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.masd_process import AUTHSERV_ID, ROOT
from support.system import REQUIRE_VARIABLE, require_program, system_tests_required

PACKAGING = ROOT / "packaging" / "postfix"
#: Postfix's name for itself: the ``by`` host of the Received header it adds,
#: which masd's trusted_hosts (by default its trusted_authserv_ids) must name.
MYHOSTNAME = AUTHSERV_ID
WAIT = 20.0  # bound of every wait on Postfix


@dataclass(frozen=True)
class PostfixPrograms:
    postfix: str
    postconf: str
    postqueue: str


def require_postfix() -> PostfixPrograms:
    """Postfix's programs; skip (or fail, when required) if Postfix cannot run here."""
    programs = PostfixPrograms(
        require_program("postfix"), require_program("postconf"), require_program("postqueue")
    )
    if os.geteuid() != 0:
        message = "a private Postfix instance must be started as root"
        if system_tests_required():
            pytest.fail(f"{message}, and {REQUIRE_VARIABLE} is set", pytrace=False)
        pytest.skip(message)
    return programs


def shipped(name: str) -> str:
    """The text of ``packaging/postfix/<name>``."""
    return (PACKAGING / name).read_text()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


TEST_AUTHENTICATOR = f"""\
# Test only: stands in for the authenticator (a DMARC milter) of a real MX.
/^X-Test-Authenticated:[[:space:]]*(.+)$/ PREPEND Authentication-Results: {AUTHSERV_ID}; $1
"""


class PostfixInstance:
    """One Postfix instance in its own directories; ``start()``, ``stop()``."""

    def __init__(
        self,
        *,
        masd_lmtp: str,
        masd_policy: str,
        relay_port: int,
        programs: PostfixPrograms | None = None,
    ) -> None:
        self.programs = programs or require_postfix()
        self.root = Path(tempfile.mkdtemp(prefix="masd-postfix-", dir="/var/tmp"))
        self.root.chmod(0o755)
        self.config_dir = self.root / "etc"
        self.queue_dir = self.root / "spool"
        self.data_dir = self.root / "data"  # created by postfix check, owned by postfix
        self.maillog = self.root / "maillog"
        self.smtp_port = _free_port()
        self.masd_lmtp = masd_lmtp
        self.masd_policy = masd_policy
        self.relay_port = relay_port
        self._write_config()

    # ---- configuration

    def postconf(self, *args: str) -> str:
        return self._run(self.programs.postconf, "-c", str(self.config_dir), *args)

    def _write_config(self) -> None:
        self.config_dir.mkdir()
        self.queue_dir.mkdir()
        main = f"""\
# ---- test-only settings
compatibility_level = 3.6
queue_directory = {self.queue_dir}
data_directory = {self.data_dir}
maillog_file = {self.maillog}
myhostname = {MYHOSTNAME}
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
relayhost = [127.0.0.1]:{self.relay_port}
alias_maps =
alias_database =
biff = no

# ---- packaging/postfix/main.cf.snippet, verbatim
{shipped("main.cf.snippet")}"""
        (self.config_dir / "main.cf").write_text(main)
        proto = Path(self._run(self.programs.postconf, "-dh", "meta_directory").strip())
        base = proto / "master.cf.proto"
        if not base.exists():
            base = Path("/usr/share/postfix/master.cf.dist")
        lines = base.read_text().splitlines()
        for i, line in enumerate(lines):
            fields = line.split()
            if fields[:2] == ["smtp", "inet"]:
                lines[i] = f"127.0.0.1:{self.smtp_port} " + line.split(None, 1)[1]
                break
        else:
            raise AssertionError(f"no 'smtp inet' service in {base}")
        master = "\n".join(lines) + "\n\n" + shipped("master.cf.snippet")
        (self.config_dir / "master.cf").write_text(master)
        (self.config_dir / "masd_header_checks").write_text(shipped("header_checks"))
        (self.config_dir / "test_authenticator").write_text(TEST_AUTHENTICATOR)
        # The site values, as the README has the operator set them.
        self.postconf("-e", f"masd_lmtp = {self.masd_lmtp}", f"masd_policy = {self.masd_policy}")
        # Test only: the stand-in authenticator runs after the shipped table.
        checks = self.postconf("-h", "header_checks").strip()
        self.postconf(
            "-e", f"header_checks = {checks}, regexp:$config_directory/test_authenticator"
        )
        chrooted = [
            line.split(" = ")[0]
            for line in self.postconf("-F", "*/*/chroot").splitlines()
            if line.endswith(" = y")
        ]
        if chrooted:
            self.postconf("-F", "-e", *(f"{name}=n" for name in chrooted))

    # ---- lifecycle

    async def start(self) -> None:
        self._run(self.programs.postfix, "-c", str(self.config_dir), "check")
        self._run(self.programs.postfix, "-c", str(self.config_dir), "start")
        await self._until(
            lambda: self._master_pid() is not None and self._accepts(), "Postfix listening"
        )

    def _master_pid(self) -> int | None:
        """The pid of this instance's master process, if it runs."""
        try:
            pid = int((self.queue_dir / "pid" / "master.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    async def stop(self) -> None:
        """``postfix stop``; wait (bounded) for the master process to exit."""
        pid = self._master_pid()
        if pid is None:
            return
        with contextlib.suppress(AssertionError):
            self._run(self.programs.postfix, "-c", str(self.config_dir), "stop")
        try:
            await self._until(lambda: not _alive(pid), "Postfix master exited")
        except AssertionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the master this instance started
            raise

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- the queue and the log

    def queue(self) -> list[dict[str, Any]]:
        """``postqueue -j``: one entry per queued message."""
        out = self._run(self.programs.postqueue, "-c", str(self.config_dir), "-j")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def flush(self) -> None:
        """``postqueue -f``: deliver deferred mail now."""
        self._run(self.programs.postqueue, "-c", str(self.config_dir), "-f")

    def log(self) -> str:
        try:
            return self.maillog.read_text(errors="replace")
        except OSError:
            return ""

    async def wait_queue(
        self, test: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        box: list[list[dict[str, Any]]] = []

        def check() -> bool:
            box[:] = [self.queue()]
            return test(box[0])

        await self._until(check, what)
        return box[0]

    async def wait_log(self, text: str) -> str:
        await self._until(lambda: text in self.log(), f"{text!r} in Postfix's log")
        return self.log()

    # ---- SMTP

    async def send(
        self, mail_from: str, rcpts: Sequence[str], data: bytes
    ) -> dict[str, tuple[int, bytes]]:
        """One SMTP transaction; the refused recipients, as smtplib reports them."""

        def work() -> dict[str, tuple[int, bytes]]:
            with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=WAIT) as client:
                return client.sendmail(mail_from, list(rcpts), data)

        return await asyncio.to_thread(work)

    async def rcpt(self, mail_from: str, rcpt: str) -> tuple[int, bytes]:
        """MAIL FROM and RCPT TO only (then RSET): Postfix's reply to the recipient."""

        def work() -> tuple[int, bytes]:
            with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=WAIT) as client:
                client.ehlo("client.example")
                code, text = client.mail(mail_from)
                assert code == 250, (code, text)
                reply = client.rcpt(rcpt)
                client.rset()
                return reply

        return await asyncio.to_thread(work)

    # ---- internals

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.smtp_port), timeout=2.0):
                return True
        except OSError:
            return False

    async def _until(self, test: Callable[[], bool], what: str) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT
        while not test():
            if loop.time() > until:
                raise AssertionError(f"{what}: not within {WAIT:g} s\n{self.log()}")
            await asyncio.sleep(0.05)

    def _run(self, *argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT, check=False)
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited with {done.returncode}\n{done.stdout}{done.stderr}"
                f"\n{self.log()}"
            )
        return done.stdout


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie left for init to reap does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
