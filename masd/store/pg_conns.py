"""The PostgreSQL store's connections: a bounded set, lent to one job at a time.

:class:`Connections` lends a connection to a coroutine on any event loop, and
takes it back from any thread:

- an idle connection is lent at once, the one used last first (so a quiet
  host keeps few connections warm); with it comes how long it was idle, so that
  the borrower pings one idle long enough to have been dropped;
- with none idle and fewer than ``limit`` open, a new one is opened on the
  loop's default executor (libpq's ``connect`` blocks; libpq's own
  ``connect_timeout`` bounds it);
- with ``limit`` in use, the borrower waits, at most ``timeout`` seconds, for
  the next one given back (a connection given back broken is closed, and its
  place handed to the next borrower, who opens a new one);
- a connection given back is kept only if it is idle on the server (no
  transaction, out of pipeline mode); any other is closed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import pq

from masd.store.files import StoreError

Opener = Callable[[], psycopg.Connection[Any]]


class Connections:
    """A set of at most ``limit`` connections (module docstring)."""

    def __init__(self, opener: Opener, limit: int, *, timeout: float, label: str) -> None:
        self._opener = opener
        self._limit = limit
        self._timeout = timeout
        self._label = label
        self._lock = threading.Lock()
        self._idle: list[tuple[psycopg.Connection[Any], float]] = []  # (conn, idle since)
        self._open = 0  # connections open or being opened
        #: Borrowers waiting; each is given a connection, or None: "open one in my place".
        self._waiters: deque[asyncio.Future[psycopg.Connection[Any] | None]] = deque()
        self._closed = False

    async def get(self) -> tuple[psycopg.Connection[Any], float]:
        """A connection of one's own, and how many seconds it was idle (0 for a new one)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self._label} is closed")
            if self._idle:
                conn, since = self._idle.pop()
                return conn, time.monotonic() - since
            waiter = None
            if self._open < self._limit:
                self._open += 1
            else:
                waiter = loop.create_future()
                self._waiters.append(waiter)
        if waiter is not None:
            try:
                given = await asyncio.wait_for(waiter, self._timeout)
            except TimeoutError:
                raise psycopg.OperationalError(
                    f"no connection of {self._limit} free within {self._timeout:g} s"
                ) from None
            if given is not None:
                return given, 0.0
        opening = loop.run_in_executor(None, self._opener)
        try:
            return await asyncio.shield(opening), 0.0
        except BaseException:
            # A borrower that stops waiting (its loop ending) leaves the connection to be
            # closed once it is open, not dropped open.
            opening.add_done_callback(_close_opened)
            self._lost()
            raise

    def put(self, conn: psycopg.Connection[Any]) -> None:
        """Take ``conn`` back, from a job that ended with it (any thread)."""
        pg = conn.pgconn
        idle = (
            not conn.closed
            and pg.transaction_status == pq.TransactionStatus.IDLE
            and pg.pipeline_status == pq.PipelineStatus.OFF
        )
        if not idle or self._closed:
            conn.close()
            self._lost()
            return
        with self._lock:
            while self._waiters:
                if self._give(self._waiters.popleft(), conn):
                    return
            self._idle.append((conn, time.monotonic()))

    def _lost(self) -> None:
        """A connection's place is free: a waiter opens one in it, or it stays free."""
        with self._lock:
            while self._waiters:
                if self._give(self._waiters.popleft(), None):
                    return
            self._open -= 1

    def _give(self, waiter: asyncio.Future[psycopg.Connection[Any] | None], value: Any) -> bool:
        """Hand ``value`` (a connection, or None for its place) to a waiter still waiting,
        on the waiter's own loop; False if it gave up."""
        loop = waiter.get_loop()
        if waiter.done() or loop.is_closed():
            return False

        def settle() -> None:
            if not waiter.done():
                waiter.set_result(value)
            elif value is not None:  # it gave up meanwhile: the connection goes back
                self.put(value)
            else:
                self._lost()

        loop.call_soon_threadsafe(settle)
        return True

    def close(self) -> None:
        """Close the idle connections; those lent are closed as they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            waiters, self._waiters = self._waiters, deque()
            self._open -= len(idle)
        for conn, _ in idle:
            conn.close()
        closed = StoreError(f"store {self._label} is closed")
        for waiter in waiters:
            loop = waiter.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_refuse, waiter, closed)


def _close_opened(opening: asyncio.Future[psycopg.Connection[Any]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _refuse(waiter: asyncio.Future[Any], exc: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(exc)
