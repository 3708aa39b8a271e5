"""masd as the benchmarks run it: a loopback config, ``masd serve`` as a child, the store read.

The type ``ticket`` of ``help.example`` is master-role with one mode,
``callback``, whose endpoint is the bench's HTTP sink.  smtp-source writes
no Authentication-Results, so its mail is unauthenticated: the
acknowledgement is refused under Principle 10 (recorded as ``mail.refused``,
no SMTP), and ``require_dmarc_for_handoff = false`` lets its ``!callback``
mail open a handoff and queue ``handoff.request`` as authenticated mail would.
Authenticated mail (:func:`bench.lmtp_load.message`) gets its
acknowledgement mailed through ``server.smtp_relay``: with ``relay_port``
that is :mod:`bench.mail_sink`; with ``dkim`` it is signed with a 2048-bit
RSA key made here.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import PYTHON, BenchError, Server, free_port

DOMAIN = "help.example"
AUTHSERV_ID = "mx.help.example"
MODE_PEER = f"mode:{DOMAIN}/ticket/callback"
READY_TIMEOUT = 300.0
_MESSAGE_ID = re.compile(r"^Message-ID:[ \t]*(\S+)", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class MasdSetup:
    directory: Path
    config: Path
    database: Path
    lmtp_port: int
    http_port: int
    sink_port: int
    callback_token: str

    @property
    def messages_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/mas/v0.1/messages"

    @property
    def sink_url(self) -> str:
        return f"http://127.0.0.1:{self.sink_port}/mas"


def _secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")


def _dkim_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _secret(path, pem.decode("ascii").strip())


@dataclass(frozen=True)
class Build:
    """A source tree of masd and the interpreter that runs it (its modules found first)."""

    name: str
    tree: Path
    python: str = PYTHON

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.tree)}


def write_config(
    directory: Path, *, sink_port: int, relay_port: int | None = None, dkim: bool = False
) -> MasdSetup:
    """``directory/masd.toml`` and its secrets; the store is ``directory/masd.db``."""
    directory.mkdir(parents=True, exist_ok=True)
    dkim_line = ""
    if dkim:
        _dkim_key(directory / "secrets" / "dkim.key")
        dkim_line = 'dkim = { selector = "bench", key_file = "secrets/dkim.key" }\n'
    token = "callback-" + secrets.token_hex(16)
    _secret(directory / "secrets" / "callback.token", token)
    _secret(directory / "secrets" / "admin.token", "admin-" + secrets.token_hex(16))
    lmtp_port, http_port = free_port(), free_port()
    while http_port == lmtp_port:
        http_port = free_port()
    config = directory / "masd.toml"
    config.write_text(
        f"""\
[server]
lmtp = "127.0.0.1:{lmtp_port}"
http = "127.0.0.1:{http_port}"
database = "masd.db"
smtp_relay = "127.0.0.1:{relay_port or free_port()}"
trusted_authserv_ids = ["{AUTHSERV_ID}"]
admin_token_file = "secrets/admin.token"
hostname = "masd.bench.example"

[domains."{DOMAIN}"]
{dkim_line}
[domains."{DOMAIN}".types.ticket]
role = "master"
modes = ["callback"]
id_prefix = "gs-"
require_dmarc_for_handoff = false

[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "http://127.0.0.1:{sink_port}/mas"
token_file = "secrets/callback.token"
deadline = "2h"
fields = ["phone"]
"""
    )
    return MasdSetup(
        directory, config, directory / "masd.db", lmtp_port, http_port, sink_port, token
    )


def migrate(setup: MasdSetup) -> None:
    """Create the store with masd's own migrations (before a direct fill)."""
    from masd.store import migrate as run_migrations

    run_migrations(setup.database)


def start(
    setup: MasdSetup,
    log: Path,
    *,
    variant: str = "",
    timeout: float = READY_TIMEOUT,
    build: Build | None = None,
    wrap: Sequence[str] = (),
) -> tuple[Server, float]:
    """``masd serve`` as a child; returns it and the seconds from spawn to ``READY=1``.

    ``variant``: changes applied by :mod:`bench.masd_variant` (measuring only).
    ``build``: another source tree of masd to run (:mod:`bench.compare`); the
    working tree's otherwise.  ``wrap``: a command that runs the interpreter (valgrind).
    """
    command = ["serve", "--config", str(setup.config)]
    python = build.python if build else PYTHON
    if variant:
        argv = [python, "-m", "bench.masd_variant", variant, "--", *command]
    else:
        argv = [python, "-m", "masd", *command]
    argv = [*wrap, *argv]
    extra = build.env() if build else {}
    # The notify socket lives as long as masd: it says STOPPING=1 there too.
    tmp = tempfile.mkdtemp(prefix="masd-bn-")
    address = str(Path(tmp) / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(0.05)
    began = time.monotonic()
    server = Server.spawn(
        "masd",
        argv,
        log,
        setup.lmtp_port,
        env={"NOTIFY_SOCKET": address, "PYTHONUNBUFFERED": "1", **extra},
        cwd=build.tree if build else None,
    )
    server.on_stop += [lambda: shutil.rmtree(tmp, ignore_errors=True), sock.close]
    while True:
        with contextlib.suppress(TimeoutError):
            if b"READY=1" in sock.recv(4096).split(b"\n"):
                return server, time.monotonic() - began
        if server.proc.poll() is not None:
            server.stop()
            raise BenchError(f"masd exited with {server.proc.returncode}:\n{server.tail()}")
        if time.monotonic() - began > timeout:
            server.stop()
            raise BenchError(f"masd sent no READY=1 within {timeout:g} s:\n{server.tail()}")


def wal_mb(database: Path) -> float:
    """Size of the store's write-ahead log now (MB)."""
    wal = database.with_name(database.name + "-wal")
    return wal.stat().st_size / 1024 / 1024 if wal.exists() else 0.0


@contextlib.contextmanager
def reading(database: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a (live) store."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    try:
        yield conn
    finally:
        conn.close()


def counts(database: Path) -> dict[str, int]:
    """Rows that prove what masd recorded (read while masd runs; WAL snapshot)."""
    with reading(database) as db:
        one = db.execute(
            "SELECT (SELECT COUNT(*) FROM messages), (SELECT COUNT(*) FROM cases), "
            "(SELECT COUNT(*) FROM handoffs), "
            "(SELECT COUNT(*) FROM outbox WHERE kind = 'contract'), "
            "(SELECT COUNT(*) FROM outbox WHERE kind = 'contract' AND state = 'done'), "
            "(SELECT COUNT(*) FROM statuses WHERE source = 'mode'), "
            "(SELECT COUNT(*) FROM outbox WHERE kind = 'mail'), "
            "(SELECT COUNT(*) FROM outbox WHERE kind = 'mail' AND state = 'done')"
        ).fetchone()
    names = (
        "messages",
        "cases",
        "handoffs",
        "contract",
        "contract_done",
        "mode_statuses",
        "mail",
        "mail_done",
    )
    return dict(zip(names, (int(x) for x in one), strict=True))


def mail_sent(database: Path) -> list[str]:
    """The Message-ID of every mail the outbox marked sent (done), one per row."""
    with reading(database) as db:
        rows = db.execute(
            "SELECT json_extract(payload, '$.message') FROM outbox"
            " WHERE kind = 'mail' AND state = 'done'"
        ).fetchall()
    out = []
    for (message,) in rows:
        found = _MESSAGE_ID.search(message or "")
        out.append(found.group(1) if found else "-")
    return out
