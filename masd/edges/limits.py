"""Connection limits of the listeners (docs/protocol.md §3 LMTP sessions, §6 HTTP connections).

A :class:`Gate` is a listener's protocol factory wrapped with a count of the
connections open at once.  One accepted beyond ``limit`` gets the
listener's refusal (LMTP ``421 4.3.2``, HTTP ``503``) and is closed at once:
no protocol object is built for it, so a flood costs a socket and a write.

With ``header_timeout`` (HTTP), a connection must bring a complete request
head within that many seconds of its first byte (or of the accept); the
edge says when a head is complete and when its answer is done
(:meth:`Gate.started`, :meth:`Gate.finished`).  An idle keep-alive
connection is the HTTP server's own business (its keep-alive timeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from masd.logs import shown

log = logging.getLogger("masd.limits")

Factory = Callable[[], asyncio.BaseProtocol]


class Gate:
    """Counts one listener's connections; refuses beyond ``limit``."""

    def __init__(
        self,
        factory: Factory,
        *,
        name: str,
        limit: int,
        refusal: bytes,
        header_timeout: float | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.factory = factory
        self.name = name
        self.limit = limit
        self.refusal = refusal
        self.header_timeout = header_timeout
        self.on_refused = on_refused
        self.open = 0  # connections open now
        self.peak = 0  # most open at once
        self.refused = 0  # refused at accept, over the limit
        self.timed_out = 0  # closed for a request head that did not arrive in time
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self._full = False

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def started(self, transport: asyncio.BaseTransport | None) -> None:
        """A request head was read on ``transport``: its deadline is off."""
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is not None:
            connection.busy += 1
            connection.disarm()

    def finished(self, transport: asyncio.BaseTransport | None) -> None:
        """The request on ``transport`` was answered; the next head's clock starts
        with its first byte."""
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is not None:
            connection.busy = max(0, connection.busy - 1)

    # -- bookkeeping for _Connection ----------------------------------------

    def _admit(self, connection: _Connection, transport: asyncio.BaseTransport) -> bool:
        if self.open >= self.limit:
            if not self._full:  # one line per episode, not one per refusal
                self._full = True
                log.warning("%s: %d open, the limit; refusing more", self.name, self.open)
            self.refused += 1
            if self.on_refused is not None:
                self.on_refused()
            return False
        self.open += 1
        self.peak = max(self.peak, self.open)
        if self.header_timeout is not None:
            self._by_transport[transport] = connection
        return True

    def _release(self, transport: asyncio.BaseTransport | None) -> None:
        self.open -= 1
        if self._full and self.open <= self.limit * 9 // 10:  # well under: no flapping
            self._full = False
            log.warning("%s: under the limit again; %d refused so far", self.name, self.refused)
        if transport is not None:
            self._by_transport.pop(transport, None)


class _Connection(asyncio.Protocol):
    """One accepted connection: refused at once, or handed to the listener's protocol."""

    __slots__ = ("_deadline", "_gate", "_inner", "_transport", "busy")

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._inner: asyncio.BaseProtocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.busy = 0  # requests read and not yet answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        gate = self._gate
        if not gate._admit(self, transport):
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(gate.refusal)
            transport.close()
            return
        self._transport = transport
        self._inner = gate.factory()
        self._inner.connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        inner = self._inner
        if inner is None:
            return
        self.disarm()
        self._gate._release(self._transport)
        self._inner = None
        self._transport = None
        inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        inner = self._inner
        if inner is None:
            return
        assert isinstance(inner, asyncio.Protocol)
        if not self.busy:
            self._arm()
        inner.data_received(data)

    def eof_received(self) -> bool | None:
        inner = self._inner
        if inner is None:
            return None
        assert isinstance(inner, asyncio.Protocol)
        return inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # -- the request-head deadline ------------------------------------------

    def _arm(self) -> None:
        timeout = self._gate.header_timeout
        if timeout is None or self._deadline is not None:
            return
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(timeout, self._expired)

    def disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.busy or self._transport is None:
            return
        self._gate.timed_out += 1
        log.info(
            "%s: no complete request head within %g s; closed peer=%s",
            self._gate.name,
            self._gate.header_timeout,
            shown(self._transport.get_extra_info("peername")),
        )
        self._transport.close()
