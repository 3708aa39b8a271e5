"""HTTP limits (docs/protocol.md §9): request-head timeout, keep-alive idle, connection cap.

The HTTP edge runs in-process on loopback with its limits injected small;
the clients are raw sockets, so a test controls every byte and sees exactly
when the server closes.  The flood tests (marker ``fault``) print counts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.http import Running, serving
from support.masd_process import MasdProcess, free_port, write_master_config

from masd.edges.http import MAX_CONNECTIONS, HttpLimits

WAIT = 10.0
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: masd\r\n\r\n"
#: Connections opened at once in a memory burst (docs/protocol.md §9 caps them at 1000).
BURST = 5000


def run(tmp_path: Path, body: Any, **limits: Any) -> None:
    async def main() -> None:
        async with serving(tmp_path, limits=HttpLimits(**limits)) as running:
            await body(running)

    asyncio.run(main())


async def connect(r: Running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = r.server.addresses[0]
    return await asyncio.open_connection(host, port)


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
    }
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), WAIT)
    return int(lines[0].split()[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (read gives EOF or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), WAIT) == b""
    except ConnectionResetError:
        return True


# --------------------------------------------------------------------------- request head


def test_a_connection_that_sends_nothing_is_closed_at_the_head_timeout(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        reader, writer = await connect(r)
        assert await closed_by_server(reader)
        writer.close()
        assert r.server.gate.timed_out == 1

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=30)


def test_a_head_trickled_in_is_closed_although_bytes_keep_coming(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        reader, writer = await connect(r)
        trickle = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200
        for byte in trickle:
            if reader.at_eof():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.02)
        assert await closed_by_server(reader)
        writer.close()
        assert r.server.gate.timed_out == 1

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=30)


def test_a_slow_body_after_a_prompt_head_is_not_cut(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        reader, writer = await connect(r)
        payload = b"{}"
        writer.write(
            b"POST /mas/v0.1/messages HTTP/1.1\r\nHost: masd\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer callback-secret-51be0d77\r\n"
            b"Content-Length: 2\r\n\r\n"
        )
        await asyncio.sleep(0.6)  # twice the head timeout: the head was complete
        writer.write(payload)
        status, _, answer = await response(reader)
        assert status == 400, answer  # read and judged: no envelope
        assert json.loads(answer)["error"] == "invalid-message"
        writer.close()
        assert r.server.gate.timed_out == 0

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=30)


def test_keep_alive_requests_in_turn_then_the_idle_connection_is_closed(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        reader, writer = await connect(r)
        for _ in range(3):
            writer.write(HEALTHZ)
            status, _, _ = await response(reader)
            assert status == 200
            await asyncio.sleep(0.15)  # idle, but under both timeouts
        # Idle between requests is the keep-alive timeout's, not the head's.
        assert r.server.gate.timed_out == 0
        assert await closed_by_server(reader)
        writer.close()
        assert r.server.gate.timed_out == 0

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=0.6)


def test_pipelined_requests_are_all_answered(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        reader, writer = await connect(r)
        writer.write(HEALTHZ * 5)
        for _ in range(5):
            status, _, _ = await response(reader)
            assert status == 200
        writer.close()

    run(tmp_path, body, header_timeout=0.3, keepalive_timeout=30)


# --------------------------------------------------------------------------- connection cap


def test_connections_over_the_cap_get_503_at_accept_then_close(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        held = [await connect(r) for _ in range(3)]
        for reader, writer in held:  # each is open, and answers
            writer.write(HEALTHZ)
            assert (await response(reader))[0] == 200
        reader, writer = await connect(r)
        status, headers, answer = await response(reader)
        assert status == 503
        assert int(headers["retry-after"]) > 0
        assert headers["connection"] == "close"
        refusal = json.loads(answer)
        assert refusal["error"] == "unavailable"
        assert "server.max_http_connections" in refusal["detail"]
        assert await closed_by_server(reader)
        writer.close()
        assert r.server.gate.refused == 1
        assert r.metrics.value("masd_connections_refused_total", listener="http") == 1
        # One closes: the next one is served.
        held[0][1].close()
        await held[0][1].wait_closed()
        for _ in range(100):
            if r.server.gate.open < 3:
                break
            await asyncio.sleep(0.02)
        reader, writer = await connect(r)
        writer.write(HEALTHZ)
        assert (await response(reader))[0] == 200
        for _, w in [*held[1:], (reader, writer)]:
            w.close()

    run(tmp_path, body, max_connections=3, keepalive_timeout=30)


# --------------------------------------------------------------------------- floods


@pytest.mark.fault
def test_200_slow_header_connections_are_all_closed(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        async def slow_client() -> bool:
            reader, writer = await connect(r)
            try:
                for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                    if reader.at_eof():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)
            except ConnectionError:
                pass
            closed = await closed_by_server(reader)
            writer.close()
            return closed

        closed = await asyncio.gather(*(slow_client() for _ in range(200)))
        gate = r.server.gate
        print(
            f"\n200 slow-header connections: {sum(closed)} closed by masd, "
            f"{gate.timed_out} on the head timeout, {gate.refused} refused, peak {gate.peak} open"
        )
        assert sum(closed) == 200
        assert gate.timed_out == 200
        # masd still answers.
        reader, writer = await connect(r)
        writer.write(HEALTHZ)
        assert (await response(reader))[0] == 200
        writer.close()

    run(tmp_path, body, header_timeout=0.5, keepalive_timeout=30)


@pytest.mark.fault
def test_connections_beyond_the_cap_are_refused_and_the_cap_holds(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        conns = await asyncio.gather(*(connect(r) for _ in range(300)))

        async def first_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
            writer.write(HEALTHZ)
            try:
                return (await response(reader))[0]
            except (ConnectionError, asyncio.IncompleteReadError):
                return 0

        statuses = await asyncio.gather(*(first_answer(rd, w) for rd, w in conns))
        gate = r.server.gate
        print(
            f"\n300 connections, cap 100: {statuses.count(200)} served, "
            f"{statuses.count(503)} refused with 503, {statuses.count(0)} reset; "
            f"peak {gate.peak} open"
        )
        assert statuses.count(200) == 100
        assert statuses.count(503) + statuses.count(0) == 200
        assert gate.refused == 200
        assert gate.peak == 100
        for _, writer in conns:
            writer.close()

    run(tmp_path, body, max_connections=100, keepalive_timeout=30)


# --------------------------------------------------------------------------- memory


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.mark.slow
@pytest.mark.fault
def test_memory_returns_to_its_level_after_connection_bursts(tmp_path: Path) -> None:
    asyncio.run(_memory_after_bursts(tmp_path))


async def _memory_after_bursts(tmp_path: Path) -> None:
    setup = write_master_config(
        tmp_path / "masd", endpoint_url="http://127.0.0.1:9/mas", smtp_port=free_port()
    )

    async def keep_alive() -> tuple[int, asyncio.StreamWriter | None]:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", setup.http_port)
        except OSError:
            return 0, None
        writer.write(HEALTHZ)
        try:
            return (await response(reader))[0], writer
        except (ConnectionError, asyncio.IncompleteReadError):
            return 0, writer

    async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
        assert masd.proc is not None
        pid = masd.proc.pid
        for _ in range(3):  # warm: every code path of a request has run once
            status, writer = await keep_alive()
            assert status == 200
            assert writer is not None
            writer.close()
        await asyncio.sleep(1.0)
        levels = [rss_mb(pid)]
        print(f"\nmasd RSS before: {levels[0]:.1f} MB")
        for burst in range(1, 4):
            held: list[tuple[int, asyncio.StreamWriter | None]] = []
            for _ in range(BURST // 500):  # all held open at once, opened 500 at a time
                held += await asyncio.gather(*(keep_alive() for _ in range(500)))
            peak = rss_mb(pid)
            statuses = [s for s, _ in held]
            for _, writer in held:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(2.0)  # masd sees every close
            levels.append(rss_mb(pid))
            print(
                f"burst {burst}: {BURST} keep-alive connections, {statuses.count(200)} served, "
                f"{statuses.count(503)} refused (503), {statuses.count(0)} reset; "
                f"RSS peak {peak:.1f} MB, after {levels[-1]:.1f} MB"
            )
            assert statuses.count(200) <= MAX_CONNECTIONS
        status, writer = await keep_alive()
        assert status == 200  # serving as before
        assert writer is not None
        writer.close()
        await masd.terminate()
    # The cap bounds what a burst can take; later bursts take nothing more.
    assert levels[1] - levels[0] < 40, levels
    assert max(levels[2:]) - levels[1] < 5, levels
