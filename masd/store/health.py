"""Whether the store can commit, as its writer last found out.

The writer (:mod:`masd.store.db`) reports every transaction to a
:class:`HealthWatch`: committed, or failed for a reason that is the store's
(:func:`fault_of`: disk full, read-only file or directory, I/O error, a file
it cannot open, a lock it cannot get), not the job's.  While it fails, the
writer probes every :data:`PROBE_SECONDS`: one small write of its own
(:func:`probe`) on its connection and, failing that, on a new one after
closing every connection of the store (a connection opened while the file
was read-only stays read-only, and keeps the others so).  Callers are
answered :class:`StoreError` meanwhile (LMTP ``451 4.3.0``, HTTP ``503``),
and nothing needs a restart.

A probe writes less than a delivery: on a full disk it may fit where a mail
does not.  So a probe that commits ends a fault only if no real transaction
failed in the last :data:`PROBE_SECONDS`; a real commit always ends it.

:meth:`masd.store.Store.check` is ``GET /healthz``'s question: the last
verdict while it is recent (:data:`HEALTH_SECONDS`), else a probe.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from masd.store.backend import SQLITE
from masd.store.files import reason

log = logging.getLogger("masd.store")

#: While the store cannot commit, the writer probes this often.
PROBE_SECONDS: Final = 1.0
#: ``GET /healthz`` trusts a verdict this recent; an older one is probed again.
HEALTH_SECONDS: Final = 5.0
#: While a fault lasts, the log says so again this often.
REMIND_SECONDS: Final = 60.0

_PROBE_BEGIN: Final = "BEGIN IMMEDIATE /* masd probe */"
_PROBE_COMMIT: Final = "COMMIT /* masd probe */"
_PROBE_ROLLBACK: Final = "ROLLBACK /* masd probe */"


def fault_of(exc: BaseException) -> str | None:
    """Why ``exc`` is the store's fault (None: the job's own error)."""
    return reason(exc) if SQLITE.classify(exc) is not None else None


def rewrite_header(conn: sqlite3.Connection) -> None:
    """Write the database header back unchanged (its ``user_version``, which masd
    does not use): the smallest write that still reaches the disk at commit."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    conn.execute(f"PRAGMA user_version = {version}")


def probe(conn: sqlite3.Connection) -> str | None:
    """One committed write on ``conn`` outside any job; None if it committed, else why not."""
    try:
        conn.execute(_PROBE_BEGIN)
        rewrite_header(conn)
        conn.execute(_PROBE_COMMIT)
    except sqlite3.Error as exc:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(_PROBE_ROLLBACK)
        return reason(exc)
    return None


@dataclass(frozen=True)
class StoreHealth:
    """What the writer last found: can the store commit?"""

    writable: bool
    #: Why not (empty while writable).
    detail: str = ""
    #: Epoch seconds when it last became writable or stopped being so.
    since: float = 0.0
    #: ``time.monotonic()`` of the last verdict (a transaction or a probe; -inf: none yet).
    checked: float = 0.0

    def describe(self, now: float | None = None) -> str:
        """One line for ``/healthz`` and the log."""
        if self.writable:
            return "the store accepts writes"
        stamp = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        lasted = (time.time() if now is None else now) - self.since
        return f"cannot commit since {stamp} ({lasted:.0f} s): {self.detail}"


class HealthWatch:
    """The verdicts of one store's writer; read from any thread (see the module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self._path = path
        self._lock = threading.Lock()
        now = time.monotonic()
        # No verdict yet: the first write, or the first check(), gives one.
        self._health = StoreHealth(True, since=time.time(), checked=float("-inf"))
        self._last_failure = float("-inf")  # monotonic, of a real transaction
        self._last_probe = now
        self._reminded = now
        self.faults = 0  # times the store stopped accepting writes
        self.reopened = 0  # connections replaced by a probe

    @property
    def current(self) -> StoreHealth:
        with self._lock:
            return self._health

    def next_probe_in(self) -> float | None:
        """Seconds until the writer should probe (None: writable, no probe needed)."""
        with self._lock:
            if self._health.writable:
                return None
            return max(0.0, self._last_probe + PROBE_SECONDS - time.monotonic())

    def transaction(self, fault: str | None) -> None:
        """A real transaction ended: committed (``fault`` None) or failed for ``fault``."""
        now = time.monotonic()
        if fault is not None:
            self._last_failure = now
        self._set(fault, now)

    def probed(self, fault: str | None, *, reopened: bool) -> None:
        """A probe ended; ``reopened``: it committed on a new connection."""
        now = time.monotonic()
        self._last_probe = now
        if reopened:
            self.reopened += 1
        if fault is None and now - self._last_failure < PROBE_SECONDS:
            # A mail failed a moment ago where this small write fitted.
            fault = self.current.detail or "a transaction failed a moment ago"
        self._set(fault, now, reopened=reopened)

    def _set(self, fault: str | None, now: float, *, reopened: bool = False) -> None:
        with self._lock:
            before = self._health
            if fault is None:
                changed = not before.writable
                since = time.time() if changed else before.since
                self._health = StoreHealth(True, since=since, checked=now)
            else:
                changed = before.writable
                since = time.time() if changed else before.since
                self._health = StoreHealth(False, fault, since=since, checked=now)
                if changed:
                    self.faults += 1
            after = self._health
        if changed:
            self._log_change(before, after, reopened=reopened)
        elif not after.writable and now - self._reminded >= REMIND_SECONDS:
            self._reminded = now
            log.error("store %s still %s", self._path, after.describe())

    def _log_change(self, before: StoreHealth, after: StoreHealth, *, reopened: bool) -> None:
        self._reminded = time.monotonic()
        if after.writable:
            log.warning(
                "store %s accepts writes again after %.1f s%s",
                self._path,
                after.since - before.since,
                " (connection reopened)" if reopened else "",
            )
        else:
            log.error(
                "store %s cannot commit: %s; deliveries get 451 4.3.0 and contract messages"
                " 503 until it can (probed every %g s)",
                self._path,
                after.detail,
                PROBE_SECONDS,
            )
