"""What each answer to a contract message means (docs/protocol.md §10), through httpx's
MockTransport.

Fast: no sockets but the last few tests, which drive the production client
(httpx over aiohttp's transport) against servers on loopback.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from masd.edges.contract_client import BODY_KEEP, ContractClient
from masd.edges.lanes import Attempt
from masd.testing import FakePeer

URL = "http://mode.test:9001/mas"
TOKEN = "callback-secret-5d1e0b7f"
BODY = json.dumps({"type": "handoff.request", "id": "m-1"}).encode()

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


def post(handler: Handler, *, url: str = URL, timeout: float = 10.0) -> tuple[Attempt, int]:
    """One post through a MockTransport; returns the outcome and how many requests were made."""
    calls = 0

    async def counted(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        answer = handler(request)
        return await answer if isinstance(answer, Awaitable) else answer

    async def main() -> Attempt:
        client = ContractClient(transport=httpx.MockTransport(counted), timeout=timeout)
        try:
            return await client.post(url, BODY, TOKEN)
        finally:
            await client.close()

    return asyncio.run(main()), calls


def streamed(status: int, body: bytes, **headers: str) -> httpx.Response:
    """An answer whose body arrives as a stream (as from a socket), not read in advance."""

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 4096):
            yield body[at : at + 4096]

    return httpx.Response(status, content=chunks(), headers=headers)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_done(status: int) -> None:
    outcome, calls = post(lambda r: httpx.Response(status, json={"ok": True}))
    assert outcome == Attempt("done", f"HTTP {status}", healthy=True)
    assert calls == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 499])
def test_4xx_fails_for_good_and_keeps_the_refusal(status: int) -> None:
    refusal = {"ok": False, "error": "invalid-message", "detail": "details.phone: not a number"}
    text = json.dumps(refusal)
    outcome, calls = post(lambda r: streamed(status, text.encode()))
    assert outcome.result == "failed"
    assert outcome.healthy is True  # the peer answered: its circuit stays closed
    assert outcome.detail == f"HTTP {status}: {text}"
    assert calls == 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed_and_fails_for_good(status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host != "mode.test":
            raise AssertionError(f"followed a redirect to {request.url}")
        return httpx.Response(status, headers={"Location": "http://elsewhere.test/"}, text="moved")

    outcome, calls = post(handler)
    assert (outcome.result, outcome.detail) == ("failed", f"HTTP {status}: moved")
    assert calls == 1


@pytest.mark.parametrize("status", [500, 502, 503, 504, 599])
def test_5xx_is_retried(status: int) -> None:
    outcome, _ = post(lambda r: httpx.Response(status, text="busy"))
    assert outcome == Attempt("retry", f"HTTP {status}: busy", healthy=False)


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (httpx.ConnectError("connection refused"), "connect failed: connection refused"),
        (httpx.ConnectTimeout("no SYN-ACK"), "connect failed: no SYN-ACK"),
        (httpx.ReadTimeout("read"), "timeout: no answer within 10 s"),
        (httpx.WriteTimeout("write"), "timeout: no answer within 10 s"),
        (httpx.PoolTimeout("pool"), "timeout: no answer within 10 s"),
        (httpx.ReadError("connection reset by peer"), "ReadError: connection reset by peer"),
        (httpx.RemoteProtocolError("illegal status line"), "RemoteProtocolError: illegal"),
    ],
)
def test_transport_errors_are_retried(error: Exception, detail: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    outcome, _ = post(handler)
    assert outcome.result == "retry"
    assert outcome.healthy is False
    assert outcome.detail.startswith(detail)


def test_a_peer_that_does_not_answer_in_time_is_retried() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        raise AssertionError("not cut short")

    outcome, _ = post(hang, timeout=0.2)
    assert outcome == Attempt("retry", "timeout: no answer within 0.2 s", healthy=False)


def test_a_body_that_trickles_forever_is_cut_short() -> None:
    """The timeout covers the whole exchange, not each read."""

    async def trickle() -> AsyncIterator[bytes]:
        while True:
            yield b"{"
            await asyncio.sleep(0.01)

    outcome, _ = post(lambda r: httpx.Response(503, content=trickle()), timeout=0.3)
    assert outcome == Attempt("retry", "timeout: no answer within 0.3 s", healthy=False)


def test_the_request_carries_the_bearer_secret_and_the_json() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    outcome, _ = post(handler)
    assert outcome.result == "done"
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == URL
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept-encoding"] == "identity"
    assert request.content == BODY


def test_cookies_a_peer_sets_are_not_sent_back() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"Set-Cookie": "session=abc; Path=/"})

    async def main() -> None:
        client = ContractClient(transport=httpx.MockTransport(handler))
        try:
            for _ in range(2):
                assert (await client.post(URL, BODY, TOKEN)).result == "done"
        finally:
            await client.close()

    asyncio.run(main())
    assert [r.headers.get("cookie") for r in seen] == [None, None]


@pytest.mark.parametrize("stream", [False, True])
def test_a_long_refusal_keeps_only_its_start(stream: bool) -> None:
    body = b"x" * 100_000
    outcome, _ = post(
        lambda r: streamed(400, body) if stream else httpx.Response(400, content=body)
    )
    assert outcome.detail == "HTTP 400: " + "x" * BODY_KEEP


def test_a_compressed_refusal_is_not_decompressed() -> None:
    """No decompression surprises: the body is kept as it came (a gzip bomb stays small)."""
    bomb = gzip.compress(b"0" * 5_000_000)
    outcome, _ = post(lambda r: streamed(400, bomb, **{"Content-Encoding": "gzip"}))
    assert outcome.result == "failed"
    assert "0000" not in outcome.detail
    assert len(outcome.detail) <= len("HTTP 400: ") + BODY_KEEP


def test_a_refusal_in_bad_utf8_is_kept_readable() -> None:
    outcome, _ = post(lambda r: httpx.Response(400, content=b"bad \xff\xfe byte"))
    assert outcome.detail == "HTTP 400: bad \ufffd\ufffd byte"


@pytest.mark.parametrize("url", ["ftp://mode.test/mas", "mode.test/mas", "http://[::1/mas"])
def test_a_url_masd_cannot_send_to_fails_for_good_without_judging_the_peer(url: str) -> None:
    outcome, calls = post(lambda r: httpx.Response(200), url=url)
    assert outcome.result == "failed"
    assert outcome.detail.startswith(f"url {url!r}")
    assert outcome.healthy is None
    assert calls == 0


def test_no_proxy_is_taken_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.test:3128")
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200)

    outcome, _ = post(handler)
    assert outcome.result == "done"
    assert seen == [URL]


# -- the production client (httpx over aiohttp) on loopback ---------------------------


def run_real(body: Callable[[ContractClient], Awaitable[Any]], timeout: float = 10.0) -> Any:
    async def main() -> Any:
        client = ContractClient(timeout=timeout)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_production_client_posts_and_classifies_answers() -> None:
    async def body(client: ContractClient) -> list[Attempt]:
        async with FakePeer(
            [(200, {"ok": True}), (409, {"ok": False, "error": "invalid-transition"}), (503, "x")]
        ) as peer:
            outcomes = [await client.post(peer.url + "mas", BODY, TOKEN) for _ in range(3)]
            [first, *_] = peer.requests
            assert first.headers["authorization"] == f"Bearer {TOKEN}"
            assert first.body == BODY
            return outcomes

    done, refused, busy = run_real(body)
    assert done == Attempt("done", "HTTP 200")
    assert refused.result == "failed"
    assert "invalid-transition" in refused.detail
    assert busy == Attempt("retry", "HTTP 503: x", healthy=False)


def test_production_client_maps_a_refused_connection() -> None:
    async def body(client: ContractClient) -> Attempt:
        peer = await FakePeer().start()
        url = peer.url + "mas"
        await peer.close()  # nothing listens there any more
        return await client.post(url, BODY, TOKEN)

    outcome = run_real(body)
    assert outcome.result == "retry"
    assert outcome.healthy is False
    assert outcome.detail.startswith("connect failed: ")


@pytest.mark.parametrize(
    "answer",
    [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n{", b""],
    ids=["not-http", "cut-short", "closed"],
)
def test_production_client_maps_broken_answers(answer: bytes) -> None:
    async def body(client: ContractClient) -> Attempt:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await client.post(f"http://127.0.0.1:{port}/mas", BODY, TOKEN)
        finally:
            server.close()
            await server.wait_closed()

    outcome = run_real(body)
    assert outcome.result == "retry"
    assert outcome.healthy is False


def test_production_client_times_out_on_a_silent_peer() -> None:
    async def body(client: ContractClient) -> Attempt:
        release = asyncio.Event()

        async def silent(rec: Any) -> tuple[int, Any]:
            await release.wait()
            return 200, {"ok": True}

        async with FakePeer(silent) as peer:
            try:
                return await client.post(peer.url + "mas", BODY, TOKEN)
            finally:
                release.set()

    outcome = run_real(body, timeout=0.3)
    assert outcome == Attempt("retry", "timeout: no answer within 0.3 s", healthy=False)
