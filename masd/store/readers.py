"""The store's readers: a small pool of threads, each with its own ``query_only`` connection.

A read runs inside one read transaction, so it sees one consistent snapshot
and never waits for the writer (WAL).  Connections are kept idle between
reads, one per reader thread at most; when the writer reopens every
connection of the store to recover from a fault (:meth:`ReaderPool.drop`),
idle ones are closed and those in use are closed when their read ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import types
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from masd.store.files import StoreError
from masd.store.files import connect as _connect
from masd.store.files import database as _database
from masd.store.files import reason as _reason
from masd.store.sql import Tx

T = TypeVar("T")

READERS = 4


def in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ReaderPool:
    """Reader threads and their connections (see the module docstring)."""

    def __init__(self, path: Path, size: int = READERS) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._closed = False
        self._generation = 0  # times every connection was closed to recover (drop)
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="masd-read")
        self._idle: list[Database] = []  # at most one per reader thread

    def submit(self, fn: Callable[[Tx], T]) -> Future[T]:
        """Run ``fn`` on a reader thread inside one read transaction."""
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self._path} is closed")
            return self._executor.submit(self._run, fn)

    def drop(self) -> None:
        """Close the idle connections; those in use close when their read ends."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for db in idle:
            db.conn.close()

    def _checkout(self) -> tuple[Database, int]:
        """An idle reader connection, or a new one; and the generation it belongs to."""
        with self._lock:
            generation = self._generation
            if self._idle:
                return self._idle.pop(), generation
        return _database(_connect(self._path, query_only=True)), generation

    def _checkin(self, db: Database, generation: int) -> None:
        with self._lock:
            if not self._closed and generation == self._generation:
                self._idle.append(db)
                return
        db.conn.close()  # the store reopened (or closed) meanwhile

    def _run(self, fn: Callable[[Tx], T]) -> T:
        try:
            db, generation = self._checkout()
        except StoreError as exc:
            raise StoreError(f"store {self._path}: read failed: {exc.detail}") from exc
        conn = db.conn
        try:
            conn.execute("BEGIN")
            try:
                value = fn(db)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise StoreError(f"store {self._path}: read failed: {_reason(exc)}") from exc
        finally:
            self._checkin(db, generation)
        if isinstance(value, types.GeneratorType | sqlite3.Cursor):
            raise StoreError(f"store read returned a lazy {type(value).__name__}; return a list")
        return value

    def close(self) -> None:
        """Wait for the reads in flight, then close every connection."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)
        with self._lock:
            idle, self._idle = self._idle, []
        for db in idle:
            db.conn.close()
