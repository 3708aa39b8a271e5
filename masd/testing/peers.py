"""Fake peers on loopback: an HTTP peer that records and answers, and an SMTP sink.

Both listen on ``127.0.0.1`` port 0 (the bound port is read back), record
everything they receive in order, and answer from a script, so a test can
make a peer fail, refuse or vanish and check what masd does about it.

``FakePeer`` stands for a mode endpoint, a master or a webhook::

    peer = await FakePeer().start()
    peer.answer((503, {"ok": False}), (200, {"ok": True}))   # then 200 {"ok": true} forever
    ...
    first, second = await peer.wait_for(2)
    await peer.close()

``SmtpSink`` stands for ``server.smtp_relay``::

    sink = await SmtpSink().start()
    sink.refuse("451 4.3.0 try later", count=1)   # the next message is refused
    await sink.set_down(True)                      # connections are refused
    mails = await sink.wait_for(1)
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import email.policy
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, Literal, Self

from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

from masd.config import TcpListen
from masd.edges.lmtp import ehlo_offering
from masd.testing.net import free_port

#: An HTTP answer: status code and body (JSON-encoded unless ``bytes`` or ``str``).
Answer = tuple[int, Any]
#: A script deciding each answer from the request (may be a coroutine function).
Script = Callable[["Recorded"], Answer | Awaitable[Answer]]

DEFAULT_ANSWER: Answer = (200, {"ok": True})


@dataclass(frozen=True)
class Recorded:
    """One HTTP request as the peer received it."""

    method: str
    path: str
    headers: Mapping[str, str]  # names lowercase
    body: bytes
    json: Any  # the decoded body, or None when it is not JSON


@dataclass(frozen=True)
class ReceivedMail:
    """One message as the sink received it (envelope and raw DATA bytes)."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    mail_options: tuple[str, ...] = ()  # ESMTP parameters of MAIL FROM (e.g. SMTPUTF8)

    @property
    def message(self) -> EmailMessage:
        """The message parsed with :data:`email.policy.default`."""
        parsed = BytesParser(policy=email.policy.default).parsebytes(self.raw)
        assert isinstance(parsed, EmailMessage)
        return parsed


class _Arrivals:
    """A list that coroutines can wait on until it holds ``n`` entries."""

    def __init__(self, what: str) -> None:
        self.items: list[Any] = []
        self._what = what
        self._grew = asyncio.Event()

    def add(self, item: Any) -> None:
        self.items.append(item)
        self._grew.set()
        self._grew = asyncio.Event()

    async def wait_for(self, n: int, timeout: float) -> None:
        if not await self.wait_until(lambda: len(self.items) >= n, timeout):
            raise TimeoutError(
                f"{self._what}: {len(self.items)} of {n} arrived within {timeout:g} s"
            )

    async def wait_until(self, test: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``test()`` holds (looked at on each arrival); False after ``timeout``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not test():
                    await self._grew.wait()
        return test()


class _Loopback(abc.ABC):
    """A fake listening on 127.0.0.1: what it received, and the port it bound (0: none yet).

    ``async with`` starts it and closes it.
    """

    def __init__(self, what: str) -> None:
        self._arrivals = _Arrivals(what)
        self._port = 0

    @abc.abstractmethod
    async def start(self) -> Self:
        """Listen (on a port of its own the first time)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop listening and drop the connections."""

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _bound_port(self) -> int:
        if not self._port:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port


class FakePeer(_Loopback):
    """An HTTP server on loopback that records every request and answers from a script.

    ``script`` is a callable (``Recorded -> (status, body)``, sync or async)
    or a sequence of answers used in order; when the answers run out (or
    with no script) every request gets ``200 {"ok": true}``.
    """

    def __init__(self, script: Script | Iterable[Answer] | None = None) -> None:
        self._script: Script | None = None
        self._answers: collections.deque[Answer] = collections.deque()
        if callable(script):
            self._script = script
        elif script is not None:
            self._answers.extend(script)
        super().__init__("FakePeer requests")
        self._runner: web.AppRunner | None = None

    @property
    def requests(self) -> list[Recorded]:
        """Every request received so far, in arrival order."""
        return list(self._arrivals.items)

    @property
    def url(self) -> str:
        """The base URL, ending in ``/`` (``http://127.0.0.1:PORT/``)."""
        return f"http://127.0.0.1:{self._bound_port()}/"

    def answer(self, *answers: Answer) -> None:
        """Queue answers for the next requests (after any already queued)."""
        self._answers.extend(answers)

    async def start(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[Recorded]:
        """Wait until ``n`` requests have arrived; returns all received so far."""
        await self._arrivals.wait_for(n, timeout)
        return self.requests

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            decoded: Any = json.loads(body)
        except ValueError:
            decoded = None
        rec = Recorded(
            method=request.method,
            path=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=decoded,
        )
        self._arrivals.add(rec)
        status, payload = await self._next_answer(rec)
        if isinstance(payload, bytes | str):
            return web.Response(status=status, body=payload)
        return web.json_response(payload, status=status)

    async def _next_answer(self, rec: Recorded) -> Answer:
        if self._answers:
            return self._answers.popleft()
        if self._script is None:
            return DEFAULT_ANSWER
        out = self._script(rec)
        if isinstance(out, Awaitable):
            return await out
        return out


class _SinkHandler:
    """aiosmtpd handler hooks: refusals on demand, acceptance otherwise."""

    def __init__(self, sink: SmtpSink) -> None:
        self._sink = sink

    async def handle_EHLO(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        hostname: str,
        responses: list[str],
    ) -> list[str]:
        # aiosmtpd reads a session's commands one after another from its stream, so it takes
        # pipelined ones as they come (RFC 2920); it does not say so by itself.
        wanted = ("PIPELINING",) if self._sink.pipelining else ()
        return ehlo_offering(session, hostname, responses, wanted)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        refusal = self._sink._take_refusal("RCPT")
        if refusal is not None:
            return refusal
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        mail = ReceivedMail(
            mail_from=str(envelope.mail_from or ""),
            rcpt_tos=tuple(envelope.rcpt_tos),
            raw=raw if isinstance(raw, bytes) else raw.encode("utf-8"),
            mail_options=tuple(envelope.mail_options),
        )
        refusal = self._sink._take_refusal("DATA")
        if refusal is not None:
            self._sink.refused.append(mail)
            return refusal
        self._sink._accept(mail)
        return "250 2.0.0 OK: queued"


class SmtpSink(_Loopback):
    """An SMTP server on loopback (aiosmtpd) that records every accepted message.

    ``refuse(reply, count)`` answers the next ``count`` messages with
    ``reply`` (a 4xx or 5xx line) at DATA or RCPT; ``set_down(True)`` drops
    the open sessions and stops listening so connections are refused,
    ``set_down(False)`` listens again on the same port.  ``on_mail`` (if
    given) sees each accepted message before the sink answers 250.  It offers
    ``PIPELINING`` unless ``pipelining=False``.
    """

    def __init__(
        self,
        *,
        hostname: str = "sink.test",
        on_mail: Callable[[ReceivedMail], None] | None = None,
        pipelining: bool = True,
    ) -> None:
        self.hostname = hostname
        self.pipelining = pipelining
        self._on_mail = on_mail
        self.refused: list[ReceivedMail] = []
        super().__init__("SmtpSink messages")
        self._handler = _SinkHandler(self)
        self._refusals: collections.deque[tuple[str, str]] = collections.deque()
        self._server: asyncio.AbstractServer | None = None
        self._protocols: list[SMTP] = []

    @property
    def messages(self) -> list[ReceivedMail]:
        """Every accepted message so far, in order."""
        return list(self._arrivals.items)

    @property
    def port(self) -> int:
        return self._bound_port()

    @property
    def relay(self) -> TcpListen:
        """Where to point ``server.smtp_relay``."""
        return TcpListen("127.0.0.1", self.port)

    def to(self, address: str) -> list[ReceivedMail]:
        """The accepted messages with ``address`` among their recipients (any case)."""
        want = address.lower()
        return [m for m in self._arrivals.items if want in (r.lower() for r in m.rcpt_tos)]

    def refuse(self, reply: str, count: int = 1, *, at: Literal["DATA", "RCPT"] = "DATA") -> None:
        """Answer the next ``count`` messages with ``reply`` (e.g. ``"554 5.7.1 no"``)."""
        code = reply[:3]
        if not (code.isdigit() and code[0] in "45"):
            raise ValueError(f"reply {reply!r} is not a 4xx or 5xx SMTP reply")
        self._refusals.extend([(at, reply)] * count)

    def _accept(self, mail: ReceivedMail) -> None:
        if self._on_mail is not None:
            self._on_mail(mail)
        self._arrivals.add(mail)

    def _take_refusal(self, stage: str) -> str | None:
        if self._refusals and self._refusals[0][0] == stage:
            return self._refusals.popleft()[1]
        return None

    async def start(self) -> Self:
        # A port below the ephemeral range: while the relay is down (set_down), a client's
        # connection elsewhere on the machine could take a kernel-chosen one, and it could
        # not listen again.
        await self._listen(self._port or free_port())
        return self

    async def set_down(self, down: bool) -> None:
        """Go down as a relay does (open sessions dropped, connections refused), or listen again."""
        if down:
            await self.close()
        elif self._server is None:
            await self._listen(self._port)

    async def close(self) -> None:
        await self._stop_listening()
        for proto in self._protocols:
            transport = getattr(proto, "transport", None)
            if transport is not None and not transport.is_closing():
                transport.close()
        self._protocols.clear()
        await asyncio.sleep(0)  # let the closed connections' handlers finish

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[ReceivedMail]:
        """Wait until ``n`` messages have been accepted; returns all accepted so far."""
        await self._arrivals.wait_for(n, timeout)
        return self.messages

    async def wait_until(self, test: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until ``test()`` holds (looked at as messages arrive); False after ``timeout``."""
        return await self._arrivals.wait_until(test, timeout)

    def _protocol(self) -> SMTP:
        proto = SMTP(
            self._handler,
            hostname=self.hostname,
            enable_SMTPUTF8=True,
            decode_data=False,
            loop=asyncio.get_running_loop(),
        )
        self._protocols = [p for p in self._protocols if not _closed(p)]
        self._protocols.append(proto)
        return proto

    async def _listen(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, "127.0.0.1", port, family=socket.AF_INET
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


def _closed(proto: SMTP) -> bool:
    transport = getattr(proto, "transport", None)
    return transport is not None and transport.is_closing()
