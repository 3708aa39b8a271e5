"""masd's accept loop: listening sockets served without asyncio's ``create_server``.

asyncio's own loop (Python 3.11), out of descriptors (``EMFILE``, ``ENFILE``),
goes on calling ``accept()`` up to the backlog's length in the same tick,
logging a traceback and scheduling a retry for each failure: thousands of
lines a second while the process is full.  :class:`AcceptServer` accepts as
asyncio does otherwise (a batch per readable event, each connection made a
transport by ``loop.connect_accepted_socket``), but on a shortage of
descriptors or memory it stops reading the socket, tries again after a pause
that doubles up to :data:`MAX_PAUSE`, and logs one warning per
:data:`LOG_INTERVAL` (with the count of failed accepts since the last one).
Any other error of ``accept()`` is treated the same way: logged, paused,
tried again, never a traceback per attempt.
Waiting connections stay in the kernel's queue meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Final

log = logging.getLogger("masd.accept")

#: Connections accepted per readable event (asyncio accepts up to its backlog).
BATCH: Final = 128
#: First pause after an accept failed for want of descriptors; it doubles.
FIRST_PAUSE: Final = 0.05
MAX_PAUSE: Final = 1.0
#: At most one "out of descriptors" line per this many seconds (all listeners).
LOG_INTERVAL: Final = 10.0


class Shortage:
    """Failed accepts (out of descriptors, mostly), logged once per :data:`LOG_INTERVAL`."""

    def __init__(self) -> None:
        self.failures = 0  # every failed accept, since start
        self.unlogged = 0  # failed since the last line
        self._logged_at: float | None = None

    def failed(self, name: str, exc: OSError, now: float) -> None:
        self.failures += 1
        self.unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_INTERVAL:
            return
        log.warning(
            "%s: cannot accept connections: %s (%s); pausing accepts "
            "(%d failed since the last such line, %d since start; next line in %g s at most)",
            name,
            exc.strerror or exc,
            errno.errorcode.get(exc.errno or 0, exc.errno),
            self.unlogged - 1,
            self.failures,
            LOG_INTERVAL,
        )
        self._logged_at, self.unlogged = now, 0


#: The process's count (all listeners share the descriptor table).
SHORTAGE: Final = Shortage()

Factory = Callable[[], asyncio.BaseProtocol]


class AcceptServer(asyncio.AbstractServer):
    """Serves ``factory`` on listening ``sockets`` (already bound and listening)."""

    def __init__(self, name: str, sockets: Sequence[socket.socket], factory: Factory) -> None:
        self.name = name
        self._sockets = list(sockets)
        self._factory = factory
        self._loop = asyncio.get_running_loop()
        self._pause = {sock.fileno(): FIRST_PAUSE for sock in self._sockets}
        self._resume: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._serving = False
        for sock in self._sockets:
            sock.setblocking(False)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        if not self._serving:
            self._serving = True
            for sock in self._sockets:
                self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def serve_forever(self) -> None:
        await self.start_serving()
        await asyncio.Future()

    def close(self) -> None:
        """Stop accepting and close the listening sockets (not the connections)."""
        self._serving = False
        for handle in self._resume.values():
            handle.cancel()
        self._resume.clear()
        for sock in self._sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()

    async def wait_closed(self) -> None:
        return None

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(BATCH):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # gone before it was accepted
            except OSError as exc:  # out of descriptors, or another refusal: never a spin
                self._back_off(sock, exc)
                return
            self._pause[sock.fileno()] = FIRST_PAUSE
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _back_off(self, sock: socket.socket, exc: OSError) -> None:
        fd = sock.fileno()
        SHORTAGE.failed(self.name, exc, self._loop.time())
        self._loop.remove_reader(fd)
        pause = self._pause.get(fd, FIRST_PAUSE)
        self._pause[fd] = min(MAX_PAUSE, pause * 2)
        self._resume[fd] = self._loop.call_later(pause, self._resumed, sock)

    def _resumed(self, sock: socket.socket) -> None:
        self._resume.pop(sock.fileno(), None)
        if self._serving and sock.fileno() >= 0:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # reset before its transport was made
            log.debug("%s: connection lost as it was accepted: %s", self.name, exc)
            conn.close()
        except Exception:
            log.exception("%s: cannot serve an accepted connection", self.name)
            conn.close()
