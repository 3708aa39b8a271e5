"""The store's checkpointer: copies the WAL into the database file beside the writer.

A commit never checkpoints (``wal_autocheckpoint=0``): a checkpoint copies
the WAL into the database file and syncs it, and done by the committing
connection it would hold every caller of that batch.  This thread, with its
own connection, runs a ``PASSIVE`` checkpoint every
:data:`CHECKPOINT_SECONDS`.  Under steady writes such a checkpoint never
catches up, SQLite never starts the log over, and it would grow without end;
once it holds more than the store's WAL limit the checkpointer asks the
writer (:attr:`Checkpointer.restart_wanted`) to run a ``RESTART`` checkpoint
between two batches.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from masd.store.files import StoreError
from masd.store.files import connect as _connect

CHECKPOINT_SECONDS = 1.0


def open_writer(path: Path, factory: type[sqlite3.Connection] | None) -> sqlite3.Connection:
    """A connection that writes (the writer's, the checkpointer's)."""
    return _connect(path) if factory is None else _connect(path, factory=factory)


class Checkpointer:
    """The checkpoint thread and its connection (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        wal_limit_bytes: int,
        seconds: float = CHECKPOINT_SECONDS,
        factory: type[sqlite3.Connection] | None = None,
    ) -> None:
        self._path = path
        self._wal_limit = wal_limit_bytes
        self._seconds = seconds
        self._factory = factory
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = open_writer(path, factory)
        self._stop = threading.Event()
        #: Set here when the WAL outgrew the limit; the writer clears it and restarts the log.
        self.restart_wanted = threading.Event()
        self._thread = threading.Thread(target=self._run, name="masd-checkpoint", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Close the connection and keep it closed while the block runs (the writer
        reopening every connection of the store); the next round opens a new one."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None
            yield

    def _run(self) -> None:
        while not self._stop.wait(self._seconds):
            with self._lock:
                try:
                    if self._conn is None:  # closed by the writer to recover
                        self._conn = open_writer(self._path, self._factory)
                    self._checkpoint(self._conn)
                except (sqlite3.Error, OSError, StoreError):
                    # Busy or failing now; the WAL keeps everything and the next
                    # round tries again (the last connection to close checkpoints too).
                    continue

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        # PASSIVE copies what it can without holding anyone up.  Under steady
        # writes the log never catches up, so SQLite never starts it over and
        # it only grows: past the limit the writer runs a RESTART between two
        # batches (from here it would wait for a gap between commits that may
        # never come), which right after this PASSIVE one has only the last
        # frames to copy.
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames * page_size > self._wal_limit:
            self.restart_wanted.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._conn is not None:
            self._conn.close()
