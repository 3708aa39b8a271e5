"""Contract messages out over HTTP (docs/protocol.md §10): one httpx client, outcomes as data.

Every message is a ``POST`` of its JSON with ``Authorization: Bearer
<the peer's secret>`` through one ``httpx.AsyncClient``.  In production its
transport is ``httpx_aiohttp.AiohttpTransport`` over one aiohttp session:
httpx's own pool spent 2 to 6 ms of CPU per request at 16 to 64 concurrent
posts, aiohttp's 0.1 to 0.2 ms (docs/performance.md), and the sender shares
the event loop with the listeners.  Unit tests pass ``httpx.MockTransport``.

What an answer means (:meth:`ContractClient.post` never raises for it):
2xx done; 3xx and 4xx failed for good (redirects are never followed, so a
3xx is a refusal), the start of the body kept as the detail; 5xx, a timeout
(:data:`HTTP_TIMEOUT` for the whole exchange) or no connection: retry.

No proxy or ``.netrc`` from the environment, no cookies kept, no compressed
answers asked for and none decoded (the body is read raw, at most a few hundred bytes).
The pool itself sets no limit on connections: the outbox's lanes bound the
sends in flight to each peer (aiohttp's per-host limit hands a freed
connection to the task that freed it, so requests waiting for one can
starve).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from masd import __version__
from masd.edges.lanes import Attempt

#: Seconds for one whole exchange: connect, send, answer and the body's start.
HTTP_TIMEOUT: Final = 10.0
#: Characters of a refusal's body kept for the thread ("recorded ... with the detail").
BODY_KEEP: Final = 300
KEEPALIVE_SECONDS: Final = 30.0
_HEADERS: Final = (
    ("Content-Type", "application/json"),
    ("Accept-Encoding", "identity"),  # nothing compressed asked for
    ("User-Agent", f"masd/{__version__}"),
)


class ContractClient:
    """Posts contract messages; see the module docstring.  Open on first use, :meth:`close` once."""

    def __init__(
        self,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = HTTP_TIMEOUT,
    ) -> None:
        self._transport = transport
        self._timeout = timeout
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = _Client(
                transport=self._transport
                or AiohttpTransport(client=self._session, trust_env=False),
                timeout=httpx.Timeout(self._timeout),
                follow_redirects=False,
                trust_env=False,  # no proxy between masd and its peers
            )
        return self._client

    def _session(self) -> aiohttp.ClientSession:
        # Called by the transport at its first request, on the running loop.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS),
            cookie_jar=aiohttp.DummyCookieJar(),  # aiohttp's side keeps none either
            trust_env=False,
            auto_decompress=False,
        )

    async def post(
        self, url: str, body: bytes, token: str, signed: Mapping[str, str] | None = None
    ) -> Attempt:
        """Send one message; what became of it (never raises for the peer or the network).

        ``signed``: the signature headers (docs/protocol.md §9.8) of a peer that
        has signing secrets, added to the Bearer secret.
        """
        try:
            # Built here, not by client.stream(): no client headers or cookies merged in.
            headers = _headers(token)
            if signed:
                headers = headers.copy()
                headers.update(signed)
            request = httpx.Request("POST", _target(url), content=body, headers=headers)
            async with asyncio.timeout(self._timeout):
                r = await self._http().send(request, stream=True)
                try:
                    # Read for a 2xx too: an answer cut short is no answer.
                    status, head = r.status_code, await _head_of(r)
                finally:
                    await r.aclose()
        except (TimeoutError, httpx.TimeoutException) as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                return Attempt("retry", f"connect failed: {exc}", healthy=False)
            return Attempt("retry", f"timeout: no answer within {self._timeout:g} s", healthy=False)
        except httpx.ConnectError as exc:
            return Attempt("retry", f"connect failed: {exc}", healthy=False)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            return Attempt("failed", f"url {url!r}: {exc}", healthy=None)
        except (httpx.TransportError, aiohttp.ClientError, OSError) as exc:
            # Reset connections, broken answers; aiohttp errors the transport leaves unmapped.
            return Attempt("retry", f"{type(exc).__name__}: {exc}", healthy=False)
        except ValueError as exc:  # a request that cannot be written (header, URL)
            return Attempt("failed", f"url {url!r}: {exc}", healthy=None)
        if 200 <= status < 300:
            return Attempt("done", f"HTTP {status}")
        if 300 <= status < 500:
            return Attempt("failed", f"HTTP {status}: {head}")
        return Attempt("retry", f"HTTP {status}: {head}", healthy=False)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _NoCookies(httpx.Cookies):
    """A peer's cookies are never read, kept or sent back."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None  # not even parsed: httpx's cookie jar adapter costs a tenth of a post

    def set_cookie_header(self, request: httpx.Request) -> None:
        return None


class _Client(httpx.AsyncClient):
    """httpx's client with :class:`_NoCookies` (its ``cookies=`` argument copies any jar)."""

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        raise TypeError("masd's contract client keeps no cookies")


_NO_COOKIES: Final = _NoCookies()


@functools.lru_cache(maxsize=256)
def _headers(token: str) -> httpx.Headers:
    """A request's headers, built once per peer (httpx copies them into each request)."""
    return httpx.Headers([*_HEADERS, ("Authorization", f"Bearer {token}")])


@functools.lru_cache(maxsize=1024)
def _target(url: str) -> httpx.URL:
    """``url`` parsed once (a peer's URL is used for every message to it)."""
    target = httpx.URL(url)
    if target.scheme not in ("http", "https") or not target.host:
        raise httpx.UnsupportedProtocol("not an http:// or https:// URL")
    return target


async def _head_of(response: httpx.Response) -> str:
    """The start of a response body, raw (never decompressed), never all of it."""
    if response.is_stream_consumed:  # an in-memory answer (a test transport), read already
        head = response.content[: BODY_KEEP * 4]
    else:
        buf = bytearray()
        async for chunk in response.aiter_raw():
            buf += chunk
            if len(buf) >= BODY_KEEP * 4:
                break  # the stream is closed with the response
        head = bytes(buf[: BODY_KEEP * 4])
    return head.decode("utf-8", "replace")[:BODY_KEEP]
