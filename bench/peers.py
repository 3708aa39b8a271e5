"""The LMTP servers masd is compared with, each started on a loopback port and counted.

- ``aiosmtpd``: :mod:`bench.lmtp_discard`, accept and discard (the Python limit);
- ``smtp-sink``: Postfix's ``smtp-sink -L`` (the C limit, discards too);
- ``dovecot``: Dovecot's LMTP delivering to a Maildir, fsync on (a durable C peer);
- ``mailman``: Mailman 3's LMTP runner (aiosmtpd, one fsync'd queue file a
  message) from its own virtualenv (a durable Python peer).

Each :class:`Peer` knows its recipient and how to count what it stored, so
every ``250`` can be checked against what is on disk where there is a disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import PYTHON, BenchError, Server, free_port, wait_port

DOMAIN = "help.example"
NOBODY = 65534


@dataclass
class Peer:
    name: str
    server: Server
    rcpt: str
    stored: Callable[[], int | None]  # messages on disk now, or None (a discarding server)


def aiosmtpd_discard(workdir: Path) -> Peer:
    port = free_port()
    server = Server.spawn(
        "aiosmtpd", [PYTHON, "-m", "bench.lmtp_discard", str(port)], workdir / "server.log", port
    )
    wait_port(port, proc=server.proc)
    return Peer("aiosmtpd-discard", server, f"bench@{DOMAIN}", lambda: None)


def smtp_sink(workdir: Path) -> Peer:
    binary = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
    if not os.path.exists(binary):
        raise BenchError("smtp-sink is missing (Debian package postfix)")
    port = free_port()
    argv = [binary, "-L"]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]  # smtp-sink refuses to run as root
    server = Server.spawn(
        "smtp-sink", [*argv, f"127.0.0.1:{port}", "1024"], workdir / "server.log", port
    )
    wait_port(port, proc=server.proc)
    return Peer("smtp-sink", server, f"bench@{DOMAIN}", lambda: None)


def dovecot_available() -> str | None:
    """Why Dovecot cannot run here, or None."""
    if not os.path.exists("/usr/sbin/dovecot") or not os.path.exists("/usr/lib/dovecot/lmtp"):
        return "dovecot-lmtpd is not installed (apt-get install dovecot-lmtpd)"
    if os.geteuid() != 0:
        return "Dovecot's master process must start as root"
    return None


def dovecot(workdir: Path) -> Peer:
    why = dovecot_available()
    if why:
        raise BenchError(why)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    base = workdir / "run"  # its unix sockets: keep workdir short (108-byte limit)
    mail = workdir / "mail"
    for d in (base, workdir / "state", mail):
        d.mkdir(parents=True, exist_ok=True)
    os.chown(mail, NOBODY, NOBODY)
    for parent in mail.resolve().parents:
        if not parent.stat().st_mode & 0o001:
            raise BenchError(f"Dovecot delivers as nobody, who may not traverse {parent}")
    conf = workdir / "dovecot.conf"
    conf.write_text(
        f"""\
base_dir = {base}
state_dir = {workdir / "state"}
log_path = {workdir / "dovecot.log"}
protocols = lmtp
listen = 127.0.0.1
ssl = no
mail_location = maildir:~/Maildir
mail_fsync = optimized
first_valid_uid = 1
auth_username_format = %Ln
passdb {{
  driver = static
  args = nopassword=y
}}
userdb {{
  driver = static
  args = uid={NOBODY} gid={NOBODY} home={mail}/%n allow_all_users=yes
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {port}
  }}
}}
"""
    )
    server = Server.spawn(
        "dovecot", ["/usr/sbin/dovecot", "-F", "-c", str(conf)], workdir / "server.log", port
    )
    wait_port(port, proc=server.proc)
    maildir = mail / "bench" / "Maildir"

    def stored() -> int:
        return sum(
            1
            for sub in ("new", "cur")
            if (maildir / sub).is_dir()
            for _ in (maildir / sub).iterdir()
        )

    return Peer("dovecot-lmtp", server, f"bench@{DOMAIN}", stored)


def mailman_available(venv: Path) -> str | None:
    if not (venv / "bin" / "runner").exists():
        return f"Mailman 3 is not installed in {venv} (make bench installs it from PyPI)"
    return None


def mailman(workdir: Path, venv: Path) -> Peer:
    why = mailman_available(venv)
    if why:
        raise BenchError(why)
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    var = workdir / "var"
    cfg = workdir / "mailman.cfg"
    cfg.write_text(
        f"""\
[paths.bench]
var_dir: {var}

[mailman]
layout: bench
site_owner: owner@{DOMAIN}

[mta]
lmtp_host: 127.0.0.1
lmtp_port: {port}
incoming: mailman.mta.null.NullMTA

[database]
class: mailman.database.sqlite.SQLiteDatabase
url: sqlite:///$DATA_DIR/mailman.db

[logging.root]
level: warning

[logging.smtp]
level: warning
"""
    )
    created = subprocess.run(
        [
            str(venv / "bin" / "mailman"),
            "-C",
            str(cfg),
            "--run-as-root",
            "create",
            f"bench@{DOMAIN}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if created.returncode != 0:
        raise BenchError(f"mailman create failed: {created.stderr or created.stdout}")
    server = Server.spawn(
        "mailman",
        [str(venv / "bin" / "runner"), "-C", str(cfg), "-r", "lmtp"],
        workdir / "server.log",
        port,
    )
    wait_port(port, timeout=60, proc=server.proc)
    queue = var / "queue" / "in"

    def stored() -> int:
        return sum(1 for p in queue.iterdir() if p.suffix == ".pck") if queue.is_dir() else 0

    return Peer("mailman3-lmtp", server, f"bench@{DOMAIN}", stored)
