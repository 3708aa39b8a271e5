"""A real DMARC verifier on loopback: dnsmasq, OpenDKIM and OpenDMARC, as Postfix milters.

- :class:`DnsServer` runs ``dnsmasq`` on port 53 of a loopback address of its
  own (127.x.y.z, so parallel runs never meet), answering only the records it
  is given (TXT: DKIM keys, SPF, ``_dmarc``) and NXDOMAIN for every other name.
- :class:`Verifier` runs OpenDKIM and OpenDMARC from the files in
  ``packaging/dmarc/``, verbatim; only the socket, the pid file and
  foreground mode come from the command line.  Each runs in a private mount
  namespace (``unshare --mount``) where ``/etc/resolv.conf`` names the test's
  DNS server: OpenDMARC (libresolv, libspf2) and OpenDKIM (libunbound) read
  the system resolver configuration and have no resolver port option.
- :func:`dkim_key` makes an RSA key and its DNS record; :func:`dkim_sign` signs
  a message as a customer's MTA would.

Root is needed (port 53, mount namespaces, Postfix); without it, or without
the programs, the tests skip, or fail under ``MASD_REQUIRE_SYSTEM_TESTS``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import dkim
import pytest

from support.masd_process import ROOT
from support.system import REQUIRE_VARIABLE, require_program, system_tests_required

PACKAGING = ROOT / "packaging" / "dmarc"
WAIT = 20.0


def shipped(name: str) -> str:
    """The text of ``packaging/dmarc/<name>``."""
    return (PACKAGING / name).read_text()


@dataclass(frozen=True)
class DmarcPrograms:
    dnsmasq: str
    opendkim: str
    opendmarc: str
    unshare: str


def require_dmarc() -> DmarcPrograms:
    """The programs; skip (or fail, when required) where they cannot run."""
    programs = DmarcPrograms(
        require_program("dnsmasq"),
        require_program("opendkim"),
        require_program("opendmarc"),
        require_program("unshare"),
    )
    if os.geteuid() != 0:
        message = "the DMARC verifiers need root (port 53, a private mount namespace)"
        if system_tests_required():
            pytest.fail(f"{message}, and {REQUIRE_VARIABLE} is set", pytrace=False)
        pytest.skip(message)
    return programs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- DKIM keys


@dataclass(frozen=True)
class DkimKey:
    private_pem: bytes
    record: str  # the TXT record at <selector>._domainkey.<domain>


def dkim_key() -> DkimKey:
    """A 2048-bit RSA key made with openssl, as dknewkey makes one."""
    openssl = require_program("openssl")
    pem = subprocess.run(
        [openssl, "genrsa", "2048"], capture_output=True, check=True, timeout=WAIT
    ).stdout
    der = subprocess.run(
        [openssl, "rsa", "-pubout", "-outform", "DER"],
        input=pem,
        capture_output=True,
        check=True,
        timeout=WAIT,
    ).stdout
    return DkimKey(pem, "v=DKIM1; k=rsa; p=" + base64.b64encode(der).decode())


def dkim_sign(message: bytes, *, domain: str, selector: str, key: DkimKey) -> bytes:
    """``message`` with a DKIM-Signature on top, as the sender's MTA signs it."""
    signature = dkim.sign(
        message,
        selector.encode(),
        domain.encode(),
        key.private_pem,
        include_headers=[b"from", b"to", b"subject", b"date", b"message-id"],
    )
    return bytes(signature) + message


# --------------------------------------------------------------------------- processes


class _Process:
    """A child process with its output in a file; ``stop()`` is SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name = name
        self.log_path = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def check_running(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"{self.name} exited with {code}:\n{self.log()}")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace: float = WAIT) -> None:
        """SIGTERM; SIGKILL if still running after ``grace`` seconds; reap."""
        self.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)


async def _until(test: object, what: str, proc: _Process) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT
    assert callable(test)
    while not test():
        proc.check_running()
        if loop.time() > until:
            raise AssertionError(f"{what}: not within {WAIT:g} s\n{proc.log()}")
        await asyncio.sleep(0.05)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- DNS


def _txt_strings(text: str) -> str:
    """dnsmasq's --txt-record form: character-strings of at most 255 octets, comma-separated."""
    assert "," not in text, text
    return ",".join(text[i : i + 250] for i in range(0, len(text), 250))


class DnsServer:
    """dnsmasq on <loopback address>:53 serving ``records`` (name -> TXT texts) only."""

    def __init__(self, records: Mapping[str, Sequence[str]], directory: Path) -> None:
        self.programs = require_dmarc()
        self.records = records
        self.directory = directory
        self.address = ""
        self.process: _Process | None = None

    def _argv(self, address: str) -> list[str]:
        argv = [
            self.programs.dnsmasq,
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            "--bind-interfaces",
            f"--listen-address={address}",
            "--port=53",
            "--local=/#/",  # every name is ours: NXDOMAIN, never forwarded
            f"--pid-file={self.directory / 'dnsmasq.pid'}",
            f"--log-facility={self.directory / 'dns.log'}",
            "--log-queries",
        ]
        for name, texts in self.records.items():
            for text in texts:
                argv.append(f"--txt-record={name},{_txt_strings(text)}")
        return argv

    async def start(self) -> None:
        for _ in range(20):
            address = (
                f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
            )
            if not _free_udp(address):
                continue
            self.address = address
            self.process = _Process("dnsmasq", self._argv(address), self.directory / "dnsmasq.out")
            await _until(lambda: self._answers(), "dnsmasq answering", self.process)
            return
        raise AssertionError("no free loopback address for the DNS server")

    def _answers(self) -> bool:
        import dns.exception
        import dns.resolver

        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [self.address]
        resolver.lifetime = 1.0
        name = next(iter(self.records))
        try:
            resolver.resolve(name, "TXT")
        except dns.exception.DNSException:
            return False
        return True

    def log(self) -> str:
        try:
            return (self.directory / "dns.log").read_text(errors="replace")
        except OSError:
            return ""

    def resolv_conf(self) -> Path:
        path = self.directory / "resolv.conf"
        path.write_text(f"nameserver {self.address}\noptions attempts:1 timeout:2\n")
        path.chmod(0o644)
        return path

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _free_udp(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((address, 53))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- the verifier


def in_namespace(programs: DmarcPrograms, resolv_conf: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace whose /etc/resolv.conf is ``resolv_conf``."""
    script = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    return [
        programs.unshare,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(resolv_conf),
        *argv,
    ]


class Verifier:
    """OpenDKIM (verifying) and OpenDMARC, configured from packaging/dmarc/, on loopback."""

    def __init__(self, dns: DnsServer) -> None:
        self.programs = require_dmarc()
        self.dns = dns
        self.directory = Path(tempfile.mkdtemp(prefix="masd-dmarc-"))
        self.directory.chmod(0o755)
        self.dkim_port = free_port()
        self.dmarc_port = free_port()
        while self.dmarc_port == self.dkim_port:
            self.dmarc_port = free_port()
        self.processes: list[_Process] = []

    @property
    def dkim_milter(self) -> str:
        """Postfix's name of OpenDKIM's socket (the site value ``dkim_milter``)."""
        return f"inet:127.0.0.1:{self.dkim_port}"

    @property
    def dmarc_milter(self) -> str:
        return f"inet:127.0.0.1:{self.dmarc_port}"

    async def start(self) -> None:
        resolv = self.dns.resolv_conf()
        # OpenDKIM resolves with libunbound, which does not read resolv.conf:
        # its Nameservers option names the DNS server (test only).
        (self.directory / "opendkim.conf").write_text(
            shipped("opendkim.conf") + f"# ---- test only\nNameservers {self.dns.address}\n"
        )
        (self.directory / "opendmarc.conf").write_text(shipped("opendmarc.conf"))
        dkim_argv = [
            self.programs.opendkim,
            "-f",
            "-x",
            str(self.directory / "opendkim.conf"),
            "-p",
            f"inet:{self.dkim_port}@127.0.0.1",
            "-P",
            str(self.directory / "opendkim.pid"),
        ]
        dmarc_argv = [
            self.programs.opendmarc,
            "-f",
            "-c",
            str(self.directory / "opendmarc.conf"),
            "-p",
            f"inet:{self.dmarc_port}@127.0.0.1",
            "-P",
            str(self.directory / "opendmarc.pid"),
        ]
        for name, argv, port in (
            ("opendkim", dkim_argv, self.dkim_port),
            ("opendmarc", dmarc_argv, self.dmarc_port),
        ):
            process = _Process(
                name, in_namespace(self.programs, resolv, argv), self.directory / f"{name}.out"
            )
            self.processes.append(process)
            await _until(lambda port=port: _accepts(port), f"{name} listening", process)

    def log(self) -> str:
        return "\n".join(f"---- {p.name}\n{p.log()}" for p in self.processes)

    def stop(self) -> None:
        # libmilter notices SIGTERM only between its 5-second polls; nothing
        # the tests look at depends on a clean exit, so the grace is short.
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.stop(grace=1.0)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class DmarcChain:
    """DNS server and verifier together: ``async with DmarcChain(records) as chain:``."""

    def __init__(self, records: Mapping[str, Sequence[str]]) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="masd-dns-"))
        self.directory.chmod(0o755)
        self.dns = DnsServer(records, self.directory)
        self.verifier = Verifier(self.dns)

    async def __aenter__(self) -> DmarcChain:
        try:
            await self.dns.start()
            await self.verifier.start()
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
        if exc is not None:
            print(f"---- DNS log ----\n{self.dns.log()}\n{self.verifier.log()}")
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.verifier.stop()
        with contextlib.suppress(Exception):
            self.dns.stop()
        self.verifier.remove()
        shutil.rmtree(self.directory, ignore_errors=True)
