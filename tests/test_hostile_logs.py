"""A hostile session against a real masd, then its whole log read back: no secret in
it, no line a client forged (docs/operations.md §10, "Logs").

Malformed HTTP header lines carrying the admin and peer secrets (a control
character after the token, a bare LF, a bare CR, a NUL, ``Authorization :``,
an obs-fold), contract messages whose ``case.key`` and ``handoff_id`` hold a
line break and a line that looks like masd's, policy and milter requests with
NUL, CR and ESC in them, an LMTP recipient with control characters.  Every line
of the text log must begin with masd's time stamp; every line of the JSON log
must be one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from support.hostile import (
    LINE,
    MILTER_NEGOTIATE,
    Hostile,
    masd_lines,
    milter_frame,
    milter_read,
    policy_request,
    write_hostile_config,
)
from support.masd_process import WAIT, MasdProcess, mx_mail

from masd.testing.lmtpclient import deliver
from masd.testing.peers import FakePeer, SmtpSink

RCPT = "ticket!callback@help.example"
#: What a client would like masd's log to say (after a line break of its own).
FORGED = "2026-01-01 00:00:00,000 INFO masd.http message peer=admin forged"


def header_attacks(secret: str) -> list[bytes]:
    """Request heads whose Authorization line aiohttp's parser refuses."""
    line = f"Authorization: Bearer {secret}".encode()
    return [
        line + b"\x01\r\n",  # a control character after the token
        line + b"\n",  # a bare LF
        line + b"\r",  # a bare CR
        line + b"\x00\r\n",  # a NUL
        f"Authorization : Bearer {secret}\r\n".encode(),  # a space before the colon
        b"Authorization: Bearer\r\n " + secret.encode() + b"\r\n",  # an obs-fold
    ]


async def _raw_http(h: Hostile, header: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports["http"])
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: masd\r\n" + header + b"\r\n")
        async with asyncio.timeout(WAIT):
            return await reader.read(200)
    finally:
        writer.close()


def _contract(key: str, handoff_id: str) -> dict[str, Any]:
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": secrets.token_hex(16),
        "case": {"address": key, "key": key},
        "handoff_id": handoff_id,
        "seq": 1,
        "status": "running",
    }


async def _contracts(h: Hostile) -> list[int]:
    forged_key = f"ticket=x@help.example\n{FORGED}\r\x00"
    messages = [_contract(forged_key, "a" * 32), _contract("ticket=x@help.example", f"h\n{FORGED}")]
    answers = []
    async with httpx.AsyncClient(base_url=h.http, timeout=WAIT) as client:
        for message in messages:
            for token in (h.callback, h.admin):  # a peer's secret; the admin's (not a peer)
                r = await client.post(
                    "/mas/v0.1/messages",
                    json=message,
                    headers={"Authorization": f"Bearer {token}"},
                )
                answers.append(r.status_code)
        r = await client.get(
            f"/mas/v0.1/cases/x%0A{FORGED}", headers={"Authorization": "Bearer " + h.admin}
        )
        answers.append(r.status_code)
    return answers


async def _policy(h: Hostile) -> list[bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports["policy"])
    answers = []
    try:
        for request in (
            policy_request("nosuch\r\x00\x1b[2J@help.example", client_address="1.2.3.4\r"),
            policy_request("ticket@help.example", queue_id="Q\x00\r"),
            b"bad\x00line\r\nrequest=smtpd_access_policy\n\n",
            policy_request("\udcff\udcfe@help.example"),
        ):
            writer.write(request)
            async with asyncio.timeout(WAIT):
                answers.append(await reader.readuntil(b"\n\n"))
    finally:
        writer.close()
    return answers


async def _milter(h: Hostile) -> list[bytes]:
    answers = []
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports["milter"])
    try:
        writer.write(MILTER_NEGOTIATE)
        assert (await milter_read(reader))[0] == b"O"
        writer.write(milter_frame(b"M", b"<a\rb\x1b@example.org>"))
        answers.append((await milter_read(reader))[0])
        writer.write(milter_frame(b"R", f"<nosuch\r\x07\x1b\n{FORGED}@help.example>".encode()))
        answers.append((await milter_read(reader))[0])
    finally:
        writer.close()
    for early in (milter_frame(b"\r", b"\n" + FORGED.encode()), milter_frame(b"O", b"\n\r")):
        reader, writer = await asyncio.open_connection("127.0.0.1", h.ports["milter"])
        writer.write(early)
        async with asyncio.timeout(WAIT):
            answers.append(await reader.read())
        writer.close()
    return answers


async def _lmtp(h: Hostile) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.ports["lmtp"])
    try:
        await reader.readline()
        for line in (b"LHLO x\r\n", b"MAIL FROM:<a@example.org>\r\n"):
            writer.write(line)
            while (await reader.readline())[3:4] == b"-":
                pass
        writer.write(b"RCPT TO:<nosuch\x01\x1b\x7f@help.example>\r\n")
        return await reader.readline()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def running(tmp_path: Path, **server: Any) -> AsyncIterator[tuple[Hostile, MasdProcess]]:
    async with FakePeer() as peer, SmtpSink() as sink:
        h = write_hostile_config(
            tmp_path, cap=20, endpoint_url=peer.url + "mas", smtp_port=sink.port, **server
        )
        async with MasdProcess(h.config, tmp_path / "masd.log") as masd:
            _, mail = mx_mail("ann@example.org", RCPT)
            result = await deliver(("127.0.0.1", h.ports["lmtp"]), "ann@example.org", [RCPT], mail)
            assert result.codes == (250,)
            await peer.wait_for(1, WAIT)  # the handoff.request went out
            yield h, masd
            assert await masd.terminate() == 0


async def _attack(h: Hostile) -> None:
    for secret in (h.admin, h.callback):
        for head in header_attacks(secret):
            answer = await _raw_http(h, head)
            assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer
    contract = await _contracts(h)
    assert all(400 <= status < 500 for status in contract), contract
    policy = await _policy(h)
    assert policy[0].startswith(b"action=REJECT"), policy
    assert all(a.startswith(b"action=") for a in policy), policy
    assert await _milter(h) == [b"c", b"y", b"", b""]
    assert (await _lmtp(h)).startswith(b"550 "), "LMTP refuses the recipient"


def test_a_hostile_session_leaves_no_secret_and_no_forged_line(tmp_path: Path) -> None:
    async def main() -> tuple[Hostile, list[str]]:
        async with running(tmp_path) as (h, masd):
            await _attack(h)
        return h, masd_lines(masd.log())

    h, lines = asyncio.run(main())
    text = "\n".join(lines)
    assert h.admin not in text
    assert h.callback not in text
    strays = [line for line in lines if not LINE.match(line)]
    assert not strays, "\n".join(strays)
    assert FORGED in text  # written, but inside a line of masd's, after an escaped break
    assert all(f"\\x0a{FORGED}" in line for line in lines if FORGED in line)
    assert "Traceback" not in text
    print(f"\nhostile session: {len(lines)} log lines, every one masd's own; no secret")


def test_json_lines_are_json_objects_with_case_and_message_ref(tmp_path: Path) -> None:
    async def main() -> tuple[Hostile, list[str]]:
        async with running(tmp_path, log_format="json") as (h, masd):
            await _attack(h)
        return h, masd_lines(masd.log())

    h, lines = asyncio.run(main())
    docs = [json.loads(line) for line in lines]  # every line: one JSON object
    assert all({"time", "level", "logger", "message"} <= set(doc) for doc in docs)
    intake = [d for d in docs if d["logger"] == "masd.lmtp" and "message_ref" in d]
    assert len(intake) == 1, intake
    assert intake[0]["case"] == "ticket=ticket-1@help.example"
    assert intake[0]["message_ref"].startswith("msg-")
    assert intake[0]["message_ref"] in intake[0]["message"]
    outbox = [d for d in docs if d["logger"] == "masd.outbox" and d.get("case")]
    assert outbox, "the outbox line names its case"
    forged = [d for d in docs if FORGED in d["message"]]
    assert forged
    assert all(f"\n{FORGED}" in d["message"] for d in forged)  # a break inside one value
    assert not [line for line in lines if h.admin in line or h.callback in line]
    print(f"\njson log: {len(docs)} lines, each one object; intake line {intake[0]}")
