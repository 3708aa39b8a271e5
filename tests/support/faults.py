"""Causing faults for the fault suite (``-m fault``), and counting what they did.

- :func:`tmpfs` mounts a small tmpfs (root only: CI runs as root) and
  :func:`fill` fills it to the last byte: a real full disk.  Without root
  the tests inject the fault through the store's seam instead:
  :class:`DiskFull` is a :class:`sqlite3.Connection` whose commits and
  checkpoints fail as SQLite's do on a full disk while :data:`DiskFull.armed`
  is set (``Store.open(..., factory=DiskFull)``).
- :class:`Handover` hands a mail to masd's LMTP listener as Postfix does:
  again and again after a ``4xx`` or a lost connection, until ``250``.
- :func:`counts` is the line every fault test prints: sent, recorded,
  repeated, lost, and the delay from first try to ``250`` (p50/p99).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from masd.store import Store
from masd.testing import lmtpclient
from support.masd_process import mx_mail

IS_ROOT = os.geteuid() == 0


# --------------------------------------------------------------------------- a full disk


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) mounted at ``path`` for the block.

    Skips the test when not root (CI runs as root) or when the mount is refused."""
    mount = shutil.which("mount") or "/usr/bin/mount"
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root (CI runs as root); the seam variant runs instead")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path}: {done.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazily: a process the test killed may still be letting go of its files.
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def remount(path: Path, mode: str) -> None:
    """Make the tmpfs at ``path`` read-only (``ro``) or writable again (``rw``)."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; the filler's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):  # ENOSPC: on to smaller writes
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    stat = os.statvfs(directory)
    assert stat.f_bavail == 0, f"{directory} still has {stat.f_bavail} blocks free"
    return filler


def disk_full() -> sqlite3.OperationalError:
    """The error SQLite raises when a write finds the disk full."""
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = sqlite3.SQLITE_FULL
    exc.sqlite_errorname = "SQLITE_FULL"
    return exc


class DiskFull(sqlite3.Connection):
    """A store connection whose commits and checkpoints fail while :attr:`armed` is set.

    Through the store's seam (``Store.open(path, factory=DiskFull)``): every
    connection the store opens to write is one of these, so reopening one does
    not clear the fault; only clearing :attr:`armed` does.
    """

    armed = threading.Event()

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        word = sql.lstrip().upper()
        if self.armed.is_set() and word.startswith(("COMMIT", "PRAGMA WAL_CHECKPOINT")):
            raise disk_full()
        return super().execute(sql, *args)


def open_with_seam(path: str | Path, **options: Any) -> Store:
    """``Store.open`` with :class:`DiskFull` connections (for ``masd.app.open_store``)."""
    return Store.open(path, factory=DiskFull, **options)


# --------------------------------------------------------------------------- mail like Postfix


@dataclass
class Handover:
    """One mail handed over like Postfix: tried again after a 4xx or a lost
    connection until ``250``.  ``replies`` holds every answer that was not 250."""

    target: tuple[str, int]
    mail_from: str
    rcpt: str
    data: bytes
    message_id: str
    first: float = 0.0
    accepted: float | None = None
    attempts: int = 0
    replies: list[str] = field(default_factory=list)

    async def run(self, *, retry: float = 0.25, give_up: float = 120.0) -> Handover:
        loop = asyncio.get_running_loop()
        self.first = loop.time()
        while True:
            self.attempts += 1
            try:
                result = await lmtpclient.deliver(
                    self.target, self.mail_from, [self.rcpt], self.data, timeout=15.0
                )
            except (lmtpclient.LmtpError, OSError) as exc:
                self.replies.append(getattr(exc, "code", type(exc).__name__))
            else:
                reply = result.recipients[0].final
                if reply.code == 250:
                    self.accepted = loop.time()
                    return self
                self.replies.append(f"{reply.code} {reply.enhanced}")
                assert reply.code < 500, f"{self.message_id}: refused for good: {reply}"
            if loop.time() - self.first > give_up:
                raise AssertionError(f"{self.message_id}: no 250 in {give_up:g} s: {self.replies}")
            await asyncio.sleep(retry)

    @property
    def delay(self) -> float:
        assert self.accepted is not None
        return self.accepted - self.first


def handover(target: tuple[str, int], sender: str, rcpt: str, **mail: Any) -> Handover:
    """A new mail from our MX (:func:`support.masd_process.mx_mail`), not yet handed over."""
    message_id, data = mx_mail(sender, rcpt, **mail)
    return Handover(target, sender, rcpt, data, message_id)


# --------------------------------------------------------------------------- counts


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def counts(
    what: str, *, sent: int, recorded: int, repeated: int, lost: int, delays: list[float]
) -> str:
    """The line a fault test prints (and the numbers it asserts on)."""
    return (
        f"{what}: sent {sent}, recorded {recorded}, repeated {repeated}, lost {lost},"
        f" delay p50 {percentile(delays, 0.5):.3f} s p99 {percentile(delays, 0.99):.3f} s"
    )


def times_each(keys: list[str]) -> dict[str, int]:
    """How often each key occurs."""
    seen: dict[str, int] = {}
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
    return seen
