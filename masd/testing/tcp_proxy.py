"""A TCP proxy on loopback that counts round trips and can hold every packet a while.

Between masd and its PostgreSQL server it shows what a database on another machine costs:
:class:`TcpProxy` listens on ``127.0.0.1`` (a port picked as :mod:`masd.testing.net` picks
them) and forwards every connection to ``target``, holding each chunk ``delay`` seconds in
each direction (a rack's network: 1 ms each way), chunks kept in order.

It counts **round trips**: the times a client sent something with nothing of its own
outstanding, so that it then waits for the server's answer.  For PostgreSQL's protocol that
is read from the messages themselves: a simple query (``Q``) or a pipeline's ``Sync`` (``S``)
is outstanding until the server's ``ReadyForQuery`` (``Z``) for it, and a trip starts with a
message the client waits on (those two, or a ``Flush``, ``H``, after statements) sent with
nothing outstanding: the statements psycopg's pipeline mode sends before it waits are one
trip, however the packets fall.  A connection that is not PostgreSQL's (or is encrypted) is
counted by turns: a client's chunk after one of the server's starts a trip.
:attr:`TcpProxy.round_trips` is the total over every connection so far.

It runs its own event loop on a thread of its own, so that a test, a benchmark or masd in
another process can use it alike: ``with TcpProxy(("127.0.0.1", port)) as proxy:``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Final

from masd.testing.net import free_port

__all__ = ["TcpProxy"]

_CHUNK: Final = 65536


class TcpProxy:
    """Forward ``127.0.0.1:port`` to ``target``; see the module docstring."""

    def __init__(self, target: tuple[str, int], *, delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self._lock = threading.Lock()
        self._trips = 0
        self._connections = 0
        self._talks: set[_Conversation] = set()
        self._ends: set[_End] = set()  # open ends, closed when the proxy stops
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def round_trips(self) -> int:
        with self._lock:
            return self._trips

    @property
    def connections(self) -> int:
        with self._lock:
            return self._connections

    @property
    def starting(self) -> int:
        """Open PostgreSQL connections still in their start-up (authentication): their
        trips are the connection's, not a statement's."""
        with self._lock:
            return sum(talk.parsed and not talk.ready for talk in self._talks)

    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    # -- life ----------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        self._loop = self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self.port = free_port()
            self._server = loop.run_until_complete(
                loop.create_server(self._accept, "127.0.0.1", self.port)
            )
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for end in list(self._ends):
                end.close(abort=True)
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(self._drained(tasks))
            loop.close()

    @staticmethod
    async def _drained(tasks: set[asyncio.Task[object]]) -> None:
        """The cancelled tasks ended, and the aborted ends' sockets closed."""
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)

    # -- one connection ------------------------------------------------------------------

    def _accept(self) -> _End:
        talk = _Conversation()
        client = _End(self, talk.client)
        asyncio.get_running_loop().create_task(self._join(client, talk))
        return client

    async def _join(self, client: _End, talk: _Conversation) -> None:
        """Open the connection to ``target`` for ``client``, then forward both ways."""
        loop = asyncio.get_running_loop()
        try:
            _, server = await loop.create_connection(lambda: _End(self, talk.server), *self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._connections += 1
            self._talks.add(talk)
        server.on_close = client.on_close = lambda: self._forget(talk)
        client.join(server)
        server.join(client)

    def _forget(self, talk: _Conversation) -> None:
        with self._lock:
            self._talks.discard(talk)

    def _count(self, trips: int) -> None:
        with self._lock:
            self._trips += trips


class _End(asyncio.Protocol):
    """One end of a forwarded connection: what it receives is written to the other end
    once it has been held ``delay`` seconds, in order (one timer per end, not one per
    chunk); the other end's full buffer pauses its reading.  Its end of input is passed on
    the same way, after what was held: a half close as a half close (the other direction
    goes on), a lost connection as a close; once both directions ended, both close."""

    def __init__(self, proxy: TcpProxy, heard: Callable[[bytes], int]) -> None:
        self._proxy = proxy
        self._heard = heard
        self._delay = proxy.delay
        self._held: deque[tuple[float, bytes]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._other: _End | None = None
        self._ended = False  # no more input: end of file, or the connection lost
        self._passed = False  # ... and that end was passed on to the other end
        self._lost = False
        self.on_close: Callable[[], None] | None = None
        proxy._ends.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=4 * _CHUNK)
        if self._other is None:
            transport.pause_reading()  # until the other end is open

    def join(self, other: _End) -> None:
        self._other = other
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        trips = self._heard(data)
        if trips:
            self._proxy._count(trips)
        if not self._delay and not self._held:
            self._write(data)
            return
        loop = asyncio.get_running_loop()
        self._held.append((loop.time() + self._delay, data))
        if self._timer is None:
            self._timer = loop.call_at(self._held[0][0], self._release)

    def _release(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        held = self._held
        while held and held[0][0] <= now:
            self._write(held.popleft()[1])
        if held:
            self._timer = asyncio.get_running_loop().call_at(held[0][0], self._release)
        elif self._ended:
            self._pass_end()

    def _write(self, data: bytes) -> None:
        other = self._other
        if other is not None and other._transport is not None and not other._transport.is_closing():
            other._transport.write(data)

    def eof_received(self) -> bool:
        self._end()
        return True  # still written to: closed once both directions ended

    def connection_lost(self, exc: Exception | None) -> None:
        self._proxy._ends.discard(self)
        self._lost = True
        self._end()
        if self.on_close is not None:
            self.on_close()

    def _end(self) -> None:
        self._ended = True
        if not self._held:
            self._pass_end()

    def _pass_end(self) -> None:
        """What this end received is all written to the other: end the other's output."""
        other = self._other
        if self._passed or other is None or other._transport is None:
            return
        self._passed = True
        if self._lost or other._passed or not other._transport.can_write_eof():
            other.close()
            if other._passed and self._transport is not None:
                self._transport.close()
        else:
            other._transport.write_eof()

    def close(self, *, abort: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        if self._transport is not None:
            if abort:
                self._transport.abort()
            else:
                self._transport.close()

    def pause_writing(self) -> None:
        if self._other is not None and self._other._transport is not None:
            self._other._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._other is not None and self._other._transport is not None:
            self._other._transport.resume_reading()


class _Conversation:
    """One connection's messages, read as PostgreSQL's protocol while they parse as it.

    Until the server is first ready for a query (the start-up and authentication), and
    for a conversation that is not the protocol, a trip is a client's chunk after one of
    the server's.  After it, a trip starts with a message the client then waits on (a
    query, a Sync or a Flush) sent when the server has answered what came before: the
    statements before it ride along, in one chunk or several."""

    def __init__(self) -> None:
        self.outstanding = 0  # queries and Syncs the server has not answered yet
        self.parsed = True  # False: not PostgreSQL's protocol, counted by turns
        self._client = _Frames(untyped=1)
        self._server = _Frames(untyped=0)
        self._last = "server"
        self.ready = False  # the server's first ReadyForQuery came
        self._answered = True  # the server spoke since the client last began to wait
        self._unasked = False  # statements sent since the last query, Sync or Flush

    def client(self, chunk: bytes) -> int:
        turn = int(self._last == "server")
        self._last = "client"
        if not self.parsed:
            return turn
        kinds = self._client.feed(chunk)
        if kinds is None or (self._client.ssl_asked and not self._server.ssl_answered):
            self._server.expect_ssl_answer = self._client.ssl_asked
        if kinds is None:
            self.parsed = False
            return turn
        if not self.ready:
            return turn
        trip = 0
        if self._waits(kinds) and self.outstanding == 0 and self._answered:
            trip, self._answered = 1, False
        self.outstanding += sum(k in (b"Q", b"S") for k in kinds)
        return trip

    def _waits(self, kinds: list[bytes]) -> bool:
        """Whether ``kinds`` ask the server for something: a query or a Sync always, a
        Flush only after statements not yet asked for (psycopg may flush once more after
        a Sync's answer, and then waits on nothing)."""
        waits = False
        for kind in kinds:
            if kind in (b"Q", b"S"):
                waits, self._unasked = True, False
            elif kind == b"H":
                waits, self._unasked = waits or self._unasked, False
            else:
                self._unasked = True
        return waits

    def server(self, chunk: bytes) -> int:
        self._last = "server"
        self._answered = True
        if self.parsed:
            kinds = self._server.feed(chunk)
            if kinds is None or self._server.encrypted:
                self.parsed = False
            else:
                self.ready = self.ready or b"Z" in kinds
                self.outstanding = max(0, self.outstanding - kinds.count(b"Z"))
        return 0


_SSL_REQUEST: Final = 80877103
_GSS_REQUEST: Final = 80877104


class _Frames:
    """Messages of one direction: a type byte and a length (the client's first ones untyped)."""

    def __init__(self, *, untyped: int) -> None:
        self._buffer = b""
        self._untyped = untyped
        self.ssl_asked = False
        self.ssl_answered = False
        self.expect_ssl_answer = False
        self.encrypted = False

    def feed(self, chunk: bytes) -> list[bytes] | None:
        """The kinds of the messages ``chunk`` completes; None when it is not the protocol."""
        self._buffer += chunk
        kinds: list[bytes] = []
        while self._buffer:
            if self.expect_ssl_answer and not self.ssl_answered:
                answer, self._buffer = self._buffer[:1], self._buffer[1:]
                self.ssl_answered = True
                self.encrypted = answer in (b"S", b"G")
                if self.encrypted:
                    return None
                continue
            if self._untyped:
                if len(self._buffer) < 8:
                    break
                length = int.from_bytes(self._buffer[:4], "big")
                if length < 8 or len(self._buffer) < length:
                    break
                code = int.from_bytes(self._buffer[4:8], "big")
                self._buffer = self._buffer[length:]
                if code in (_SSL_REQUEST, _GSS_REQUEST):
                    self.ssl_asked = True
                else:
                    self._untyped = 0
                continue
            if len(self._buffer) < 5:
                break
            kind = self._buffer[:1]
            length = int.from_bytes(self._buffer[1:5], "big")
            if length < 4 or not kind.isalnum():  # "1", "2", "3": parse, bind, close done
                return None
            if len(self._buffer) < 1 + length:
                break
            self._buffer = self._buffer[1 + length :]
            kinds.append(kind)
        return kinds
