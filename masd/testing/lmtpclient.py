"""A small asyncio LMTP client (RFC 2033) that reads every per-recipient reply.

After DATA an LMTP server answers once for each recipient it accepted at
RCPT, in RCPT order (RFC 2033 §4.2).  ``smtplib.LMTP`` reads only one reply
there, so masd's tests, demo and conformance runner use this client.

    result = await deliver("/run/masd/lmtp.sock", "a@example.org",
                           ["ticket@help.example"], raw)
    result.recipients[0].final.code   # 250, or the RCPT refusal

No pipelining: each command waits for its reply.  ``timeout`` bounds every
wait (connect, each reply), not the session as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from masd.core.errors import MasdError

__all__ = [
    "LmtpConnection",
    "LmtpError",
    "LmtpResult",
    "RecipientResult",
    "Reply",
    "deliver",
    "encode_data",
]

Target = str | os.PathLike[str] | tuple[str, int]

_REPLY_LINE = re.compile(r"([2-5][0-9]{2})(?:([ -])(.*))?", re.DOTALL)
_ENHANCED = re.compile(r"[245]\.[0-9]{1,3}\.[0-9]{1,3}")
_NEWLINE = re.compile(rb"\r?\n")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)
MAX_REPLY_LINES = 100


class LmtpError(MasdError):
    """The session could not go on.

    ``code``: ``lmtp-connect`` (cannot connect), ``lmtp-timeout`` (no reply in
    time), ``lmtp-protocol`` (a malformed reply or the connection closed),
    ``lmtp-refused`` (the greeting, LHLO or MAIL was refused; ``reply`` holds
    the server's answer).
    """

    code = "lmtp-protocol"

    def __init__(self, detail: str, *, code: str | None = None, reply: Reply | None = None) -> None:
        super().__init__(detail, code=code)
        self.reply = reply


@dataclass(frozen=True)
class Reply:
    """One (possibly multi-line) reply: the code and the text of each line."""

    code: int
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def enhanced(self) -> str | None:
        """The RFC 3463 enhanced status code of the first line, if any."""
        first = self.lines[0].split(" ", 1)[0] if self.lines else ""
        return first if _ENHANCED.fullmatch(first) else None

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 400

    def __str__(self) -> str:
        return f"{self.code} {self.text}" if self.lines else str(self.code)


@dataclass(frozen=True)
class RecipientResult:
    """What the server said about one recipient: at RCPT and, if accepted, after DATA."""

    address: str
    rcpt: Reply
    data: Reply | None  # None: refused at RCPT, or DATA itself was refused

    @property
    def final(self) -> Reply:
        """The reply that decides this recipient's fate."""
        return self.data if self.data is not None else self.rcpt

    @property
    def delivered(self) -> bool:
        return self.data is not None and 200 <= self.data.code < 300


@dataclass(frozen=True)
class LmtpResult:
    """One mail transaction: the replies to MAIL and DATA and one result per recipient."""

    mail: Reply
    data: Reply | None  # the reply to the DATA command (354, or a refusal); None if not sent
    recipients: tuple[RecipientResult, ...]

    @property
    def codes(self) -> tuple[int, ...]:
        """The final code of each recipient, in the order given."""
        return tuple(r.final.code for r in self.recipients)


def encode_data(data: bytes) -> bytes:
    """The DATA payload on the wire: CRLF line ends, dot-stuffed, with the final ``.``.

    Bare LF becomes CRLF; a message not ending in a line end gets one
    (RFC 5321 §4.1.1.4); every line that starts with ``.`` gets one more
    (RFC 5321 §4.5.2).
    """
    body = _NEWLINE.sub(b"\r\n", data)
    if body and not body.endswith(b"\r\n"):
        body += b"\r\n"
    return _LEADING_DOT.sub(b"..", body) + b".\r\n"


def _bracket(address: str) -> str:
    return address if address.startswith("<") and address.endswith(">") else f"<{address}>"


class LmtpConnection:
    """An open LMTP session after a successful greeting and LHLO.

    Use :meth:`open` (or ``async with await LmtpConnection.open(...)``);
    several transactions may run on one connection with :meth:`send`.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        timeout: float,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._timeout = timeout
        self.greeting = Reply(0, ())
        self.lhlo = Reply(0, ())
        self.extensions: frozenset[str] = frozenset()

    @classmethod
    async def open(
        cls, target: Target, *, lhlo: str = "localhost", timeout: float = 30.0
    ) -> LmtpConnection:
        """Connect (unix socket path, or ``(host, port)``), read the greeting, send LHLO."""
        try:
            async with asyncio.timeout(timeout):
                if isinstance(target, tuple):
                    reader, writer = await asyncio.open_connection(target[0], target[1])
                else:
                    reader, writer = await asyncio.open_unix_connection(os.fspath(target))
        except TimeoutError:
            raise LmtpError(
                f"connect to {target!r}: no answer in {timeout}s", code="lmtp-timeout"
            ) from None
        except OSError as exc:
            raise LmtpError(f"connect to {target!r}: {exc}", code="lmtp-connect") from exc
        conn = cls(reader, writer, timeout=timeout)
        try:
            conn.greeting = await conn.read_reply()
            if conn.greeting.code != 220:
                raise LmtpError(
                    f"greeting refused: {conn.greeting}", code="lmtp-refused", reply=conn.greeting
                )
            conn.lhlo = await conn.command(f"LHLO {lhlo}")
            if conn.lhlo.code != 250:
                raise LmtpError(f"LHLO refused: {conn.lhlo}", code="lmtp-refused", reply=conn.lhlo)
        except BaseException:
            await conn.abort()
            raise
        conn.extensions = frozenset(
            line.split(" ", 1)[0].upper() for line in conn.lhlo.lines[1:] if line
        )
        return conn

    async def __aenter__(self) -> LmtpConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
        else:
            await self.abort()

    async def read_reply(self) -> Reply:
        """Read one reply, however many lines it has."""
        code: int | None = None
        lines: list[str] = []
        while True:
            try:
                async with asyncio.timeout(self._timeout):
                    raw = await self._reader.readline()
            except TimeoutError:
                raise LmtpError(f"no reply in {self._timeout}s", code="lmtp-timeout") from None
            except (OSError, ValueError) as exc:  # ValueError: a line over the stream limit
                raise LmtpError(f"reading a reply: {exc}") from exc
            if not raw.endswith(b"\n"):
                raise LmtpError(f"connection closed in a reply (got {raw!r})")
            line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            match = _REPLY_LINE.fullmatch(line)
            if match is None:
                raise LmtpError(f"malformed reply line {line!r}")
            this = int(match.group(1))
            if code is not None and this != code:
                raise LmtpError(f"reply line {line!r} changes the code {code} of its reply")
            code = this
            lines.append(match.group(3) or "")
            if match.group(2) != "-":
                return Reply(code, tuple(lines))
            if len(lines) >= MAX_REPLY_LINES:
                raise LmtpError(f"reply of more than {MAX_REPLY_LINES} lines")

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            async with asyncio.timeout(self._timeout):
                await self._writer.drain()
        except TimeoutError:
            raise LmtpError(f"cannot write in {self._timeout}s", code="lmtp-timeout") from None
        except OSError as exc:
            raise LmtpError(f"writing: {exc}") from exc

    async def command(self, line: str) -> Reply:
        """Send one command line (no CRLF) and read its reply."""
        if "\r" in line or "\n" in line:
            raise LmtpError(f"command {line!r} holds a line break", code="lmtp-usage")
        await self.write(line.encode("utf-8") + b"\r\n")
        return await self.read_reply()

    async def send(self, mail_from: str, rcpt_to: Sequence[str], data: bytes) -> LmtpResult:
        """One transaction: MAIL, RCPT for each recipient, DATA with one reply per accepted one.

        ``mail_from`` ``""`` or ``"<>"`` is the null sender.  SMTPUTF8 and
        BODY=8BITMIME are asked for when needed and offered.
        """
        params = ""
        if any(not a.isascii() for a in (mail_from, *rcpt_to)) and "SMTPUTF8" in self.extensions:
            params += " SMTPUTF8"
        if not data.isascii() and "8BITMIME" in self.extensions:
            params += " BODY=8BITMIME"
        mail = await self.command(f"MAIL FROM:{_bracket(mail_from)}{params}")
        if mail.code != 250:
            await self.command("RSET")
            raise LmtpError(f"MAIL refused: {mail}", code="lmtp-refused", reply=mail)
        rcpt_replies = [await self.command(f"RCPT TO:{_bracket(r)}") for r in rcpt_to]
        accepted = [i for i, reply in enumerate(rcpt_replies) if reply.code in (250, 251)]
        after: dict[int, Reply] = {}
        data_reply: Reply | None = None
        if accepted:
            data_reply = await self.command("DATA")
            if data_reply.code == 354:
                await self.write(encode_data(data))
                for i in accepted:
                    after[i] = await self.read_reply()
        else:
            await self.command("RSET")
        return LmtpResult(
            mail=mail,
            data=data_reply,
            recipients=tuple(
                RecipientResult(r, rcpt_replies[i], after.get(i)) for i, r in enumerate(rcpt_to)
            ),
        )

    async def close(self) -> None:
        """QUIT (best effort) and close the connection."""
        with contextlib.suppress(LmtpError):
            await self.command("QUIT")
        await self.abort()

    async def abort(self) -> None:
        """Close the connection without QUIT."""
        self._writer.close()
        try:
            async with asyncio.timeout(self._timeout):
                await self._writer.wait_closed()
        except (OSError, TimeoutError):
            pass


async def deliver(
    target: Target,
    mail_from: str,
    rcpt_to: Sequence[str],
    data: bytes,
    *,
    lhlo: str = "localhost",
    timeout: float = 30.0,
) -> LmtpResult:
    """Deliver one message over a fresh LMTP session; return every reply.

    ``target`` is a unix socket path or ``(host, port)``.  Raises
    :class:`LmtpError` when the session cannot reach DATA's replies (no
    connection, a refused greeting, LHLO or MAIL, a malformed reply, a
    timeout); a refused recipient is a result, not an error.
    """
    conn = await LmtpConnection.open(target, lhlo=lhlo, timeout=timeout)
    async with conn:
        return await conn.send(mail_from, rcpt_to, data)
