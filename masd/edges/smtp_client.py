"""One SMTP client session with the relay, on an asyncio protocol: commands pipelined (RFC 2920).

A transaction written the way RFC 2920 allows when the relay says ``PIPELINING``:
``MAIL``, ``RCPT`` and ``DATA`` in one write, their three replies read together,
then the message and its final reply, two round trips where a command at a
time takes four.  Without ``PIPELINING`` (or for ``RSET``, ``EHLO``, ``QUIT``)
one command is written and its reply read before the next.

The rules of the wire this follows:

- a reply is one or more lines ``NNN-text`` ending with a line ``NNN text``
  (RFC 5321 §4.2); lines end with CRLF, a lone LF is taken as well; a reply
  over :data:`MAX_REPLY` octets, or a line that does not start with three
  digits, ends the session (:class:`ProtocolError`);
- replies come back in the order the commands were written, one each: every
  reply is kept until the command it answers reads it, so replies that arrive
  together are never lost;
- the message is sent as RFC 5321 §4.5.2 says: every line ending made CRLF, a
  line starting with ``.`` given a second one, CRLF added if the message does
  not end with one, then ``.`` CRLF;
- the relay closing the connection fails every reply still awaited
  (:class:`Disconnected`); a reply awaited longer than ``timeout`` seconds
  fails with :class:`Timeout`, and the session is closed (what the relay
  answers later would be taken for the next command's reply).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

#: The longest reply taken (RFC 5321 §4.5.3.1.5 gives 512 octets a line).
MAX_REPLY: Final = 64 * 1024
_ENDINGS: Final = re.compile(rb"\r\n|\r|\n")
_DOTS: Final = re.compile(rb"(?m)^\.")


class Reply(NamedTuple):
    code: int
    text: str  # its lines' texts joined with LF


class SmtpClientError(Exception):
    """The session cannot go on."""


class Disconnected(SmtpClientError):
    """The relay closed the connection (or it was lost)."""


class Timeout(SmtpClientError):
    """The relay did not answer in time."""


class ProtocolError(SmtpClientError):
    """The relay's reply is not SMTP."""


class _Wire(asyncio.Protocol):
    """Bytes in, replies out, in order; one future per reply awaited."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._lines: list[str] = []  # the lines read so far of a reply not yet complete
        self._held = 0  # their length
        self._replies: deque[Reply] = deque()  # complete, not yet read
        self._waiters: deque[asyncio.Future[Reply]] = deque()
        #: What ended the session, once it ended.
        self.error: SmtpClientError | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if not self._line(line):
                return
        if len(self._buffer) + self._held > MAX_REPLY:
            self._too_long()

    def _line(self, line: bytes) -> bool:
        code = line[:3]
        if len(code) != 3 or not code.isdigit() or line[3:4] not in (b"", b" ", b"-"):
            shown = line[:80].decode("utf-8", "replace")
            self._fail(ProtocolError(f"not an SMTP reply: {shown!r}"))
            return False
        self._lines.append(line[4:].strip(b" \t").decode("utf-8", "surrogateescape"))
        if line[3:4] == b"-":
            self._held += len(line)
            return self._held <= MAX_REPLY or self._too_long()
        reply, self._lines, self._held = Reply(int(code), "\n".join(self._lines)), [], 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(reply)
                return True
        self._replies.append(reply)
        return True

    def _too_long(self) -> bool:
        self._fail(ProtocolError(f"a reply longer than {MAX_REPLY} octets"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Disconnected(f"connection lost: {exc}" if exc else "the relay closed it"))

    def _fail(self, error: SmtpClientError) -> None:
        if self.error is None:
            self.error = error
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def next_reply(self) -> asyncio.Future[Reply]:
        """The next reply not yet read, as a future (done at once if it came already)."""
        waiter: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        if self._replies:
            waiter.set_result(self._replies.popleft())
        elif self.error is not None:
            waiter.set_exception(self.error)
        else:
            self._waiters.append(waiter)
        return waiter


class Session:
    """An SMTP session: :meth:`open` it, then commands and transactions on it."""

    def __init__(self, wire: _Wire, timeout: float) -> None:
        self._wire = wire
        self._timeout = timeout
        self.extensions: frozenset[str] = frozenset()  # EHLO's keywords, upper case

    @classmethod
    async def open(cls, host: str, port: int, *, timeout: float) -> tuple[Session, Reply]:
        """Connect and read the greeting (any code: the caller judges it)."""
        loop = asyncio.get_running_loop()
        try:
            _, wire = await asyncio.wait_for(loop.create_connection(_Wire, host, port), timeout)
        except TimeoutError:
            raise Timeout(f"timed out connecting after {timeout:g} s") from None
        session = cls(wire, timeout)
        return session, (await session._read(1, "the greeting"))[0]

    @property
    def is_connected(self) -> bool:
        transport = self._wire.transport
        return transport is not None and not transport.is_closing()

    def supports(self, keyword: str) -> bool:
        return keyword.upper() in self.extensions

    async def hello(self, name: str) -> Reply:
        """EHLO (its extensions kept), or HELO where the relay does not know EHLO."""
        reply = await self.command(b"EHLO " + name.encode())
        if reply.code == 250:
            lines = reply.text.split("\n")[1:]
            self.extensions = frozenset(w.split(" ", 1)[0].upper() for w in lines if w)
            return reply
        self.extensions = frozenset()
        return await self.command(b"HELO " + name.encode())

    async def command(self, line: bytes) -> Reply:
        """One command and its reply."""
        return (await self.commands([line]))[0]

    async def commands(self, lines: Sequence[bytes]) -> list[Reply]:
        """``lines`` written at once (pipelined), and their replies in order."""
        self._write(b"".join(line + b"\r\n" for line in lines))
        return await self._read(len(lines), lines[0].split(b" ", 1)[0].decode())

    async def message(self, message: bytes) -> Reply:
        """After a ``354``: the message, dot-stuffed and ended, and the final reply."""
        data = _DOTS.sub(b"..", _ENDINGS.sub(b"\r\n", message))
        if not data.endswith(b"\r\n"):
            data += b"\r\n"
        self._write(data + b".\r\n")
        return (await self._read(1, "the message"))[0]

    def _write(self, data: bytes) -> None:
        transport = self._wire.transport
        if transport is None or transport.is_closing():
            raise self._wire.error or Disconnected("the session is closed")
        transport.write(data)

    async def _read(self, count: int, what: str) -> list[Reply]:
        waiters = [self._wire.next_reply() for _ in range(count)]
        replies: list[Reply] = []
        try:
            async with asyncio.timeout(self._timeout):
                for waiter in waiters:
                    replies.append(await waiter)
        except TimeoutError:
            waited = f"{self._timeout:g} s"
            raise Timeout(f"timed out waiting {waited} for the reply to {what}") from None
        finally:
            if len(replies) < count:
                # A reply given up on would be read as the next command's: the session ends.
                for waiter in waiters:
                    waiter.cancel()
                self.close()
        return replies

    async def quit(self, timeout: float = 1.0) -> None:
        """QUIT, its reply awaited at most ``timeout`` seconds, then closed."""
        try:
            self._write(b"QUIT\r\n")
            async with asyncio.timeout(timeout):
                await self._wire.next_reply()
        except (SmtpClientError, TimeoutError):
            pass  # closing anyway
        finally:
            self.close()

    def close(self) -> None:
        transport = self._wire.transport
        if transport is not None:
            transport.close()
