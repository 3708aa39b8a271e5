"""Signed requests over real loopback sockets (docs/protocol.md §9.8), both directions.

Outbound, masd's outbox posts to a loopback peer that checks the signature
with the verification snippet of docs/protocol.md (not masd's own code).
Inbound, masd's HTTP edge refuses what a peer that must sign sends unsigned,
tampered, stale or without a header.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.http import CALLBACK, CHAT, Running, serving, status_message
from support.outbox import Env, deliver, inbound, make_env, query
from test_signing import documented_verify, new_secret, signed_config, write_secrets

from masd.clock import TestClock
from masd.core import signing
from masd.edges.context import EdgeContext
from masd.edges.http import MAX_BODY
from masd.edges.outbox import Outbox
from masd.testing import FakePeer, Recorded

START = 1_800_000_000.0
MESSAGES_PATH = "/mas/v0.1/messages"
VERIFY = documented_verify()


# ---------------------------------------------------------------- masd signs what it sends


def outbound(
    tmp_path: Path, secret_lines: tuple[str, ...], body: Callable[..., Awaitable[None]]
) -> None:
    """An outbox whose callback endpoint signs with ``secret_lines``, on a test clock."""

    async def main() -> None:
        peer = FakePeer()
        env = await make_env(tmp_path, clock=TestClock(START), peer=peer)
        try:
            config = tmp_path / "masd.toml"
            write_secrets(tmp_path, *secret_lines)
            config.write_text(signed_config(require=False)(config.read_text()))
            env = env.reopen()
            await body(env, peer)
        finally:
            await env.close()

    asyncio.run(main())


async def one_request(env: Env, peer: FakePeer) -> Recorded:
    raw, _ = inbound("ticket!callback@help.example")
    await deliver(env, "ticket!callback@help.example", raw)
    outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics))
    outbox.start()
    try:
        [request] = await peer.wait_for(1)
    finally:
        await outbox.stop()
    return request


def test_masd_signs_what_it_sends_with_its_clock_and_the_message_id(tmp_path: Path) -> None:
    secret = new_secret()

    async def body(env: Env, peer: FakePeer) -> None:
        request = await one_request(env, peer)
        assert request.headers["authorization"] == f"Bearer {'callback-secret-5d1e0b7f'}"
        assert request.headers["webhook-id"] == request.json["id"]
        assert request.headers["webhook-timestamp"] == str(int(START))
        assert VERIFY([secret], request.headers, request.body, int(START))
        assert not VERIFY([new_secret()], request.headers, request.body, int(START))
        assert not VERIFY([secret], request.headers, request.body + b" ", int(START))
        [row] = await query(env, "SELECT state FROM outbox WHERE kind = 'contract'")
        assert row["state"] == "done"

    outbound(tmp_path, (secret,), body)


def test_with_two_secrets_masd_signs_with_both_for_a_rotation(tmp_path: Path) -> None:
    old, new = new_secret(), new_secret()

    async def body(env: Env, peer: FakePeer) -> None:
        request = await one_request(env, peer)
        assert len(request.headers["webhook-signature"].split(" ")) == 2
        assert VERIFY([old], request.headers, request.body, int(START))
        assert VERIFY([new], request.headers, request.body, int(START))

    outbound(tmp_path, (old, new), body)


def test_a_peer_without_signing_secrets_gets_no_signature_headers(tmp_path: Path) -> None:
    async def main() -> None:
        env = await make_env(tmp_path)
        try:
            request = await one_request(env, env.peer)
            assert not {"webhook-id", "webhook-timestamp", "webhook-signature"} & set(
                request.headers
            )
        finally:
            await env.close()

    asyncio.run(main())


# ---------------------------------------------------------------- masd checks what it receives

JSON = {"Content-Type": "application/json"}


def inbound_run(
    tmp_path: Path,
    body: Callable[[Running, list[str]], Awaitable[None]],
    *,
    lines: int = 1,
    require: bool = True,
) -> None:
    keys = [new_secret() for _ in range(lines)]
    write_secrets(tmp_path, *keys)

    async def main() -> None:
        async with serving(tmp_path, adjust=signed_config(require=require)) as running:
            await body(running, keys)

    asyncio.run(main())


async def send(
    r: Running,
    raw: bytes,
    secrets: list[str],
    *,
    token: str = CALLBACK,
    stamp: float | None = None,
    sent: bytes | None = None,
    drop: str = "",
) -> httpx.Response:
    """POST ``sent`` (default ``raw``) signed over ``raw`` by ``secrets`` at ``stamp``."""
    keys = [signing.parse_secret(s) for s in secrets]
    when = int(r.clock.now() if stamp is None else stamp)
    headers = {**JSON, "Authorization": f"Bearer {token}"}
    if keys:
        headers.update(signing.headers(keys, json.loads(raw)["id"], when, raw))
    headers.pop(drop, None)
    return await r.client.post(MESSAGES_PATH, content=sent or raw, headers=headers)


async def accepted_status(r: Running, seq: int = 1) -> bytes:
    key, handoff = await r.open_callback_case()
    return json.dumps(status_message(key, handoff, seq, "scheduled")).encode()


def refused_401(response: httpx.Response, header: str) -> None:
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["error"] == "unauthenticated"
    assert body["detail"].startswith(f"{header}:"), body


def test_masd_accepts_a_signed_request_from_a_peer_that_must_sign(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        response = await send(r, await accepted_status(r), keys)
        assert response.status_code == 200, response.text
        assert response.json() == {"ok": True}

    inbound_run(tmp_path, body)


def test_a_missing_header_is_401_naming_it(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        for header in ("webhook-signature", "webhook-timestamp", "webhook-id"):
            refused_401(await send(r, raw, keys, drop=header), header)
        refused_401(await send(r, raw, []), "webhook-id")
        # Nothing refused was recorded: the signed request is still the first.
        assert (await send(r, raw, keys)).json() == {"ok": True}

    inbound_run(tmp_path, body)


def test_a_tampered_body_is_401(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        tampered = raw.replace(b'"scheduled"', b'"running"')
        assert tampered != raw
        refused_401(await send(r, raw, keys, sent=tampered), "webhook-signature")

    inbound_run(tmp_path, body)


def test_an_old_or_future_timestamp_is_401(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        now = r.clock.now()
        refused_401(await send(r, raw, keys, stamp=now - 400), "webhook-timestamp")
        refused_401(await send(r, raw, keys, stamp=now + 400), "webhook-timestamp")
        assert (await send(r, raw, keys, stamp=now - 200)).status_code == 200

    inbound_run(tmp_path, body)


def test_rotation_either_of_two_secrets_verifies(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        old, new = keys
        assert (await send(r, await accepted_status(r), [old])).status_code == 200
        assert (await send(r, await accepted_status(r), [new])).status_code == 200
        refused_401(await send(r, await accepted_status(r), [new_secret()]), "webhook-signature")

    inbound_run(tmp_path, body, lines=2)


def test_the_signature_is_checked_after_413_and_before_400(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        big = b'{"id": "x", "pad": "' + b"a" * MAX_BODY + b'"}'
        assert (await send(r, big, [])).status_code == 413
        not_json = b"{not json"
        headers = {**JSON, "Authorization": f"Bearer {CALLBACK}"}
        response = await r.client.post(MESSAGES_PATH, content=not_json, headers=headers)
        refused_401(response, "webhook-id")

    inbound_run(tmp_path, body)


def test_without_require_signature_an_unsigned_request_is_accepted(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        assert (await send(r, await accepted_status(r), [])).status_code == 200

    inbound_run(tmp_path, body, require=False)


def test_a_peer_that_need_not_sign_is_not_asked_to(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        # chat has no signing entry; its Bearer secret alone still authenticates it.
        raw = json.dumps(status_message("ticket=gs-9@help.example", "h", 1, "scheduled")).encode()
        response = await send(r, raw, [], token=CHAT)
        assert response.status_code == 404, response.text

    inbound_run(tmp_path, body)


def test_headers_that_are_not_text_are_401_never_a_fault(tmp_path: Path) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        good = signing.headers([signing.parse_secret(keys[0])], "x", int(r.clock.now()), raw)
        for name in ("webhook-id", "webhook-signature", "webhook-timestamp"):
            headers: dict[str, Any] = {**JSON, "Authorization": f"Bearer {CALLBACK}", **good}
            headers[name] = b"v1,\xff\xfe\x80"
            response = await r.client.post(MESSAGES_PATH, content=raw, headers=headers)
            assert response.status_code == 401, (name, response.text)

    inbound_run(tmp_path, body)


def test_a_signature_header_sent_twice_is_401_naming_it(tmp_path: Path) -> None:
    """Two lines of one signature header are refused, whichever of them is valid: never the
    first read alone (RFC 9110 §5.3: the header is no list that lines may be joined into)."""

    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        good = signing.headers([signing.parse_secret(keys[0])], "x", int(r.clock.now()), raw)
        forged = {"webhook-id": "y", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"}
        for name in good:
            for pair in ((good[name], forged[name]), (forged[name], good[name])):
                headers = [*JSON.items(), ("Authorization", f"Bearer {CALLBACK}")]
                headers += [(k, v) for k, v in good.items() if k != name]
                headers += [(name, value) for value in pair]
                response = await r.client.post(MESSAGES_PATH, content=raw, headers=headers)
                refused_401(response, name)
                assert "2 lines" in response.json()["detail"]
        assert (await send(r, raw, keys)).json() == {"ok": True}

    inbound_run(tmp_path, body)


async def _raw_answer(r: Running, request: bytes) -> tuple[bytes, dict[str, Any], bytes]:
    """``request`` on a fresh connection: the status line, the JSON body, what followed."""
    host, port = r.server.addresses[0]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)  # until masd closes the connection
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer[:300]
    decoder = json.JSONDecoder()
    doc, end = decoder.raw_decode(rest.decode())
    return head.split(b"\r\n")[0], doc, rest[end:]


def test_a_signature_header_over_8190_bytes_is_masds_json_refusal_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(r: Running, keys: list[str]) -> None:
        raw = await accepted_status(r)
        good = signing.headers([signing.parse_secret(keys[0])], "x", int(r.clock.now()), raw)
        long = good["webhook-signature"] + " v1,AAAA" * 1200  # 9.6 KB
        headers = {**JSON, "Authorization": f"Bearer {CALLBACK}", **good}
        response = await r.client.post(
            MESSAGES_PATH, content=raw, headers={**headers, "webhook-signature": long}
        )
        assert response.status_code == 400, response.text
        detail = response.json()["detail"]
        assert response.json()["error"] == "invalid-message"
        assert detail.startswith("webhook-signature:"), detail
        assert "over 8190" in detail, detail
        assert "v1," not in detail  # never the value itself
        # Longer than masd reads a header at all: its JSON refusal still, then the close.
        lines = [f"{k}: {v}" for k, v in headers.items()]
        huge = f"webhook-signature: v1,{'A' * 70_000}"
        request = "\r\n".join([f"POST {MESSAGES_PATH} HTTP/1.1", "Host: masd", *lines, huge])
        status, doc, after = await _raw_answer(r, request.encode() + b"\r\n\r\n" + raw)
        assert status.split()[1] == b"400", status
        assert (doc["ok"], doc["error"]) == (False, "invalid-message"), doc
        assert after == b""
        # And a request line that is no HTTP at all.
        status, doc, _ = await _raw_answer(r, b"NOT HTTP AT ALL\r\n\r\n")
        assert status.split()[1] == b"400", status
        assert doc["error"] == "invalid-message", doc
        assert (await send(r, raw, keys)).json() == {"ok": True}

    with caplog.at_level(logging.INFO):
        inbound_run(tmp_path, body)
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if "not a valid HTTP" in r.getMessage() and "16380" in r.getMessage()
    ]
    assert "AAAA" not in line, line  # the parser's excerpt of the value is never logged
