"""The policy listener: Postfix asks masd at RCPT time whether a recipient exists.

Postfix's SMTP access policy delegation (``check_policy_service``, see
Postfix's SMTPD_POLICY_README): the client sends ``name=value`` lines ended
by an empty line; masd answers ``action=...`` and an empty line; one
connection carries any number of requests.  docs/protocol.md §3: "Unknown recipients
should also be refused at RCPT time so Postfix can reject at SMTP time,
never accepted and dropped" — refusing during the SMTP dialogue means no
bounce is ever sent to a forged sender (no backscatter).

The decision is the LMTP edge's own RCPT check
(:func:`masd.edges.lmtp.check_recipient`), mapped to an access action:

- accepted, or a domain masd does not serve: ``DUNNO`` (Postfix decides);
- a permanent refusal (bad local part, unknown type, no such case):
  ``REJECT 5.1.1 <detail>``;
- a temporary one (store unavailable, internal fault):
  ``DEFER_IF_PERMIT 4.3.0 <detail>``;
- a request that is not an RCPT-stage access policy request, or that is
  malformed: ``DUNNO`` and a log line.  The listener never crashes on
  input and never waits without bound: an over-long line or request gets
  ``DUNNO`` and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from masd.config import Listen
from masd.core.errors import MasdError
from masd.edges.context import EdgeContext
from masd.edges.limits import Gate
from masd.edges.lmtp import check_recipient
from masd.edges.lmtp_replies import Replies, ReplyCode
from masd.edges.sockets import ListenError, StreamListener, serve

log = logging.getLogger("masd.policy")

#: Longest request line accepted (Postfix's attributes are far shorter).
MAX_LINE: Final = 8192
#: Most attributes in one request (Postfix 3.7 sends about 35).
MAX_ATTRIBUTES: Final = 200
#: Idle time allowed between requests; Postfix drops idle policy connections
#: itself after smtpd_policy_service_max_idle (300 s).
IDLE_TIMEOUT: Final = 600.0
#: How long stop() lets connections finish the request they are answering.
CLOSE_TIMEOUT: Final = 5.0
METRIC: Final = "masd_policy_requests_total"
#: ``server.max_policy_connections`` by default.
MAX_CONNECTIONS: Final = 100

DUNNO: Final = "DUNNO"


class PolicyListenError(ListenError):
    """The policy listener cannot start (address in use, a non-socket at the path)."""

    code = "policy-listen"


class PolicyRequestError(MasdError):
    """A request that is not a well-formed access policy request (answered DUNNO)."""

    code = "policy-request"


@dataclass(frozen=True)
class Decision:
    """The answer to one request: the access action and why (for the log)."""

    action: str
    outcome: str  # metrics label: dunno, reject, defer, not-rcpt, malformed
    detail: str


def parse_request(lines: list[bytes]) -> dict[str, str]:
    """The attributes of one request (lines without their ends); refusals named."""
    if len(lines) > MAX_ATTRIBUTES:
        raise PolicyRequestError(f"request has {len(lines)} attributes, over {MAX_ATTRIBUTES}")
    attrs: dict[str, str] = {}
    for raw in lines:
        # Values are UTF-8 when the client used SMTPUTF8; anything else is kept
        # as lone surrogates, which the address check refuses by name.
        line = raw.decode("utf-8", "surrogateescape")
        name, sep, value = line.partition("=")
        if not sep or not name or name != name.strip():
            raise PolicyRequestError(f"line {line[:80]!r} is not name=value")
        if name in attrs:
            raise PolicyRequestError(f"attribute {name!r} given twice")
        attrs[name] = value
    return attrs


def action_for(reply: ReplyCode, text: str) -> Decision:
    """The access action for the LMTP RCPT reply ``reply``."""
    if reply is Replies.RECIPIENT_OK:
        return Decision(DUNNO, "dunno", text)
    if reply is Replies.UNKNOWN_DOMAIN:
        # Not one of masd's domains: other restrictions (relay checks) decide.
        return Decision(DUNNO, "dunno", text)
    # ReplyCode.line keeps the detail to one printable line of bounded length.
    enhanced_and_text = reply.line(text).split(" ", 1)[1]
    if reply.code >= 500:
        return Decision(f"REJECT {enhanced_and_text}", "reject", text)
    return Decision(f"DEFER_IF_PERMIT {enhanced_and_text}", "defer", text)


class PolicyHandler:
    """Answers access policy requests from the LMTP edge's recipient check."""

    def __init__(self, ctx: EdgeContext) -> None:
        self.rt = ctx.rt
        self.store = ctx.store
        self.metrics = ctx.metrics

    async def decide(self, attrs: Mapping[str, str]) -> Decision:
        """The decision for one parsed request.  Never raises."""
        request = attrs.get("request")
        if request != "smtpd_access_policy":
            return _malformed(f"request={request!r}, not smtpd_access_policy")
        state = attrs.get("protocol_state", "")
        if state.upper() != "RCPT":
            # Placed in another restriction list (DATA, END-OF-MESSAGE): there is
            # no single recipient to judge, so masd has no opinion.
            return Decision(DUNNO, "not-rcpt", f"protocol_state={state!r}, not RCPT")
        rcpt = attrs.get("recipient", "")
        if not rcpt:
            return _malformed("protocol_state=RCPT without a recipient")
        try:
            reply, text = await check_recipient(self.rt, self.store, rcpt)
        except Exception:
            log.exception("policy rcpt=%s: internal fault", rcpt)
            reply, text = Replies.FAULT, "temporary failure, try again later"
        return action_for(reply, text)

    async def answer(self, attrs: Mapping[str, str]) -> Decision:
        """:meth:`decide`, logged and counted."""
        decision = await self.decide(attrs)
        self._account(decision, attrs)
        return decision

    def _account(self, decision: Decision, attrs: Mapping[str, str]) -> None:
        self.metrics.inc(METRIC, outcome=decision.outcome)
        rcpt = attrs.get("recipient", "")
        queue_id = attrs.get("queue_id", "")
        if decision.outcome in ("reject", "defer"):
            log.info(
                "policy rcpt=%s client=%s action=%s",
                rcpt,
                attrs.get("client_address", ""),
                decision.action,
            )
        elif decision.outcome == "malformed":
            log.warning("policy request refused (answered DUNNO): %s", decision.detail)
        else:
            log.debug(
                "policy rcpt=%s queue_id=%s action=DUNNO (%s)", rcpt, queue_id, decision.detail
            )

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: requests until EOF, idle timeout or a framing error."""
        try:
            while True:
                try:
                    lines = await self._read_request(reader)
                except TimeoutError:
                    return
                except PolicyRequestError as exc:
                    # The stream cannot be framed any more: answer, then hang up.
                    self._account(_malformed(exc.detail), {})
                    await _reply(writer, DUNNO)
                    return
                if lines is None:
                    return
                try:
                    attrs = parse_request(lines)
                except PolicyRequestError as exc:
                    decision = _malformed(exc.detail)
                    self._account(decision, {})
                else:
                    decision = await self.answer(attrs)
                await _reply(writer, decision.action)
        except ConnectionError:
            return
        except Exception:
            log.exception("policy connection fault")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> list[bytes] | None:
        """The lines of the next request, or None at a clean end of the stream."""
        lines: list[bytes] = []
        while True:
            try:
                async with asyncio.timeout(IDLE_TIMEOUT):
                    raw = await reader.readline()
            except ValueError as exc:  # the stream's limit: a line over MAX_LINE
                raise PolicyRequestError(f"a line over {MAX_LINE} octets") from exc
            if not raw:
                if lines:
                    log.warning("policy client closed the connection inside a request")
                return None
            if not raw.endswith(b"\n"):
                return None  # EOF in the middle of a line
            line = raw[:-1].removesuffix(b"\r")
            if not line:
                if lines:
                    return lines
                continue  # stray empty lines between requests
            lines.append(line)
            if len(lines) > MAX_ATTRIBUTES:
                raise PolicyRequestError(f"request over {MAX_ATTRIBUTES} attributes")


def _malformed(detail: str) -> Decision:
    return Decision(DUNNO, "malformed", detail)


async def _reply(writer: asyncio.StreamWriter, action: str) -> None:
    writer.write(f"action={action}\n\n".encode("ascii", "replace"))
    await writer.drain()


class PolicyServer(StreamListener):
    """The running listener; :meth:`close` also ends open client connections."""

    close_timeout = CLOSE_TIMEOUT

    def __init__(self, handler: PolicyHandler) -> None:
        super().__init__()
        self.handler = handler

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self.connection(writer):
            await self.handler.serve(reader, writer)


async def start_policy(
    listen: Listen | None,
    handler: PolicyHandler,
    *,
    sock: socket.socket | None = None,
    max_connections: int = MAX_CONNECTIONS,
) -> PolicyServer:
    """Bind ``listen`` (or serve the inherited listening ``sock``) and start answering.

    A unix socket gets mode 0660 before it accepts anyone (Postfix's smtpd
    must be in the socket's group).  A connection beyond ``max_connections``
    gets a temporary refusal (:func:`over_the_limit`) and is closed.
    """
    server = PolicyServer(handler)
    loop = asyncio.get_running_loop()

    def connection() -> asyncio.StreamReaderProtocol:
        reader = asyncio.StreamReader(limit=MAX_LINE, loop=loop)
        return asyncio.StreamReaderProtocol(reader, server._client, loop=loop)

    if listen is None and sock is None:
        raise PolicyListenError("no policy listener configured (server.policy)")
    gate = Gate(
        connection,
        name="policy",
        limit=max_connections,
        refusal=over_the_limit(max_connections),
        on_refused=lambda: handler.metrics.inc("masd_connections_refused_total", listener="policy"),
    )
    server.server = await serve(gate, listen, sock=sock, error=PolicyListenError)
    return server


def over_the_limit(limit: int) -> bytes:
    """The answer to a connection over the cap, written before its request is read:
    Postfix takes it as the answer to its first request (a temporary refusal)."""
    action = (
        f"DEFER_IF_PERMIT 4.3.2 {limit} policy connections open "
        "(server.max_policy_connections), try again later"
    )
    return f"action={action}\n\n".encode("ascii")
