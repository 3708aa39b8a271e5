"""The HTTP listener over real loopback sockets (docs/protocol.md §9, §16)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.http import (
    ADMIN,
    CALLBACK,
    CHAT,
    CRM,
    Running,
    deliver,
    serving,
    status_message,
)

from masd.cli.text import format_case
from masd.config import UnixListen
from masd.edges.http import MAX_BODY, REPLIES
from masd.read import case_views as readside

MESSAGES = "/mas/v0.1/messages"
JSON = {"Content-Type": "application/json"}


def run(tmp_path: Path, body: Callable[[Running], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        async with serving(tmp_path, **kw) as running:
            await body(running)

    asyncio.run(main())


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def post(
    r: Running, message: object, secret: str = CALLBACK, **headers: str
) -> httpx.Response:
    raw = message if isinstance(message, bytes) else json.dumps(message).encode()
    return await r.client.post(MESSAGES, content=raw, headers={**JSON, **auth(secret), **headers})


def refused(response: httpx.Response, status: int, code: str, detail: str = "") -> None:
    """The response is ``status`` with ``{"ok": false, "error": code, "detail": ...detail...}``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["ok"] is False
    assert body["error"] == code
    assert detail in body["detail"]


# --------------------------------------------------------------------------- order of checks


def test_401_missing_or_unknown_secret_before_anything_else(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        refused(await r.client.post(MESSAGES, content=b"{}", headers=JSON), 401, "unauthenticated")
        wrong = await post(r, {}, secret="not-a-peer-secret")
        refused(wrong, 401, "unauthenticated", "matches no peer")
        assert wrong.headers["www-authenticate"].startswith("Bearer")
        basic = await r.client.post(
            MESSAGES, content=b"{}", headers={**JSON, "Authorization": f"Basic {CALLBACK}"}
        )
        refused(basic, 401, "unauthenticated")
        # Wrong media type and a body over the bound: still 401 first.
        huge = b"x" * (MAX_BODY + 10)
        first = await r.client.post(
            MESSAGES, content=huge, headers={"Content-Type": "text/plain", **auth("nope")}
        )
        refused(first, 401, "unauthenticated")
        # The admin secret is not a peer secret.
        refused(await post(r, {}, secret=ADMIN), 401, "unauthenticated")

    run(tmp_path, body)


def test_415_then_413(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        good = auth(CALLBACK)
        for ctype in ("text/plain", "application/x-www-form-urlencoded"):
            response = await r.client.post(
                MESSAGES, content=b"{}", headers={"Content-Type": ctype, **good}
            )
            refused(response, 415, "unsupported-media-type", ctype)
        no_type = await r.client.post(MESSAGES, content=b"{}", headers=good)
        refused(no_type, 415, "unsupported-media-type", "missing")
        latin = await r.client.post(
            MESSAGES,
            content=b"{}",
            headers={"Content-Type": "application/json; charset=latin-1", **good},
        )
        refused(latin, 415, "unsupported-media-type", "charset")
        # A wrong media type wins over a body that is too large.
        big = b" " * (MAX_BODY + 1)
        both = await r.client.post(
            MESSAGES, content=big, headers={"Content-Type": "text/plain", **good}
        )
        refused(both, 415, "unsupported-media-type")
        # charset=utf-8 is fine: the request gets as far as the envelope check.
        utf8 = await r.client.post(
            MESSAGES,
            content=b"{}",
            headers={"Content-Type": "application/json; charset=utf-8", **good},
        )
        refused(utf8, 400, "invalid-message", "mas_modes_version")

    run(tmp_path, body)


def test_413_by_content_length_and_by_chunked_body(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        big = b" " * (MAX_BODY + 1)
        by_length = await post(r, big)
        refused(by_length, 413, "too-large", "Content-Length")

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b" " * (64 * 1024)
            yield b"{}"

        chunked = await r.client.post(
            MESSAGES, content=chunks(), headers={**JSON, **auth(CALLBACK)}
        )
        assert "content-length" not in chunked.request.headers
        assert chunked.request.headers["transfer-encoding"] == "chunked"
        refused(chunked, 413, "too-large", "body")
        # Exactly at the bound is read (and then refused for what it says).
        padded = b"{}" + b" " * (MAX_BODY - 2)
        refused(await post(r, padded), 400, "invalid-message")

    run(tmp_path, body)


def test_400_envelope_faults(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        refused(await post(r, b"{not json"), 400, "invalid-message", "not JSON")
        refused(await post(r, b"\xff\xfe"), 400, "invalid-message", "not JSON")
        refused(await post(r, [1, 2]), 400, "invalid-message", "not an object")
        refused(
            await post(r, {"type": "handoff.status"}), 400, "invalid-message", "mas_modes_version"
        )
        version = {"mas_modes_version": "0.2", "type": "handoff.status", "id": "m1"}
        refused(await post(r, version), 400, "unsupported-version", '"0.2"')
        unknown = {"mas_modes_version": "0.1", "type": "handoff.wave", "id": "m1"}
        refused(await post(r, unknown), 400, "unknown-type", "handoff.wave")
        # The version is checked before the type.
        both = {"mas_modes_version": "9", "type": "nope", "id": "m1"}
        refused(await post(r, both), 400, "unsupported-version")

    run(tmp_path, body)


def test_403_for_a_type_the_peer_may_not_send(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        mail_send = {
            "mas_modes_version": "0.1",
            "type": "mail.send",
            "id": "m1",
            "case": {"address": "ticket=gs-1@help.example", "key": "ticket=gs-1@help.example"},
            "in_reply_to": "x",
            "body": "hi",
        }
        refused(await post(r, mail_send, CALLBACK), 403, "forbidden", "mail.send")
        status = status_message("ticket=gs-1@help.example", "h" * 32, 1, "running")
        refused(await post(r, status, CRM), 403, "forbidden", "handoff.status")
        # Checked before the body's schema: a malformed status from a master is 403.
        refused(await post(r, {**status, "seq": "one"}, CRM), 403, "forbidden")

    run(tmp_path, body)


# --------------------------------------------------------------------------- inside the store job


def test_statuses_accepted_recorded_and_on_commit(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        first = await post(r, status_message(key, hid, 1, "negotiating", needs=["phone"]))
        assert first.status_code == 200, first.text
        assert first.json() == {"ok": True}
        assert r.commits
        second = await post(r, status_message(key, hid, 2, "scheduled", at="2026-12-01T10:00:00Z"))
        assert second.json() == {"ok": True}
        doc = (await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(ADMIN))).json()
        (handoff,) = doc["case"]["handoffs"]
        assert handoff["handoff_id"] == hid
        assert handoff["status"] == "scheduled"
        assert handoff["seq"] == 2
        assert handoff["mode"] == "callback"
        thread = (await r.client.get(f"/mas/v0.1/cases/{key}/thread", headers=auth(ADMIN))).json()
        mode_statuses = [
            e for e in thread["entries"] if e["kind"] == "status" and e["source"] == "mode"
        ]
        assert [(e["status"], e["status_seq"]) for e in mode_statuses] == [
            ("negotiating", 1),
            ("scheduled", 2),
        ]
        assert mode_statuses[0]["needs"] == ["phone"]
        assert mode_statuses[1]["status_at"] == "2026-12-01T10:00:00Z"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", mode_statuses[1]["at"])
        assert r.metrics.value("masd_http_requests_total", status="200") == 2

    run(tmp_path, body)


def test_one_info_line_per_contract_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="masd"):
            await post(r, status_message(key, hid, 1, "negotiating", mid="st-one"))
            await post(r, status_message(key, hid, 1, "running", mid="st-stale"))
            await post(r, status_message(key, hid, 2, "completed", mid="st-bad"))
        lines = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.INFO]
        assert lines == [
            f"message peer=mode:help.example/ticket/callback type=handoff.status id={mid} "
            f"case={key} handoff={hid} status={status} recorded={recorded} error={error}"
            for mid, status, recorded, error in (
                ("st-one", 200, "negotiating", "-"),
                ("st-stale", 200, "-", "-"),
                ("st-bad", 409, "-", "invalid-transition"),
            )
        ]

    run(tmp_path, body)


def test_idempotency_returns_the_original_answer(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        msg = status_message(key, hid, 1, "running", mid="same-id")
        assert (await post(r, msg)).json() == {"ok": True}
        # Same (peer, id), different body: the original answer, nothing new recorded.
        again = await post(r, status_message(key, hid, 2, "completed", mid="same-id"))
        assert again.status_code == 200
        assert again.json() == {"ok": True}
        doc = (await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(ADMIN))).json()
        assert doc["case"]["handoffs"][0]["status"] == "running"
        # A refusal is kept too: a repeat gets the 400 even though it is now valid.
        bad = status_message(key, hid, 2, "completed", mid="bad-id")
        bad["seq"] = -1
        refused(await post(r, bad), 400, "invalid-message", "seq")
        bad["seq"] = 2
        refused(await post(r, bad), 400, "invalid-message", "seq")
        # Another peer with the same id is its own scope (and gets its own answer).
        other = await post(r, status_message(key, hid, 3, "completed", mid="same-id"), CHAT)
        refused(other, 403, "forbidden", hid)

    run(tmp_path, body)


def test_a_repeat_gets_the_kept_answer_before_its_schema_but_not_before_its_json(
    tmp_path: Path,
) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        assert (await post(r, status_message(key, hid, 1, "running", mid="kept"))).json() == {
            "ok": True
        }
        # docs/protocol.md §9.3: idempotency (8) before the schema (9) ...
        schema = status_message(key, hid, "one", "dancing", mid="kept")
        again = await post(r, schema)
        assert (again.status_code, again.json()) == (200, {"ok": True})
        # ... but after the JSON itself (4), in any field.
        raw = json.dumps(status_message(key, hid, 2, "running", mid="kept"))
        nul = raw[:-1] + ', "x-note": {"k": "a\\u0000b"}}'
        refused(
            await post(r, nul.encode()), 400, "invalid-message", "x-note.k: a string with a NUL"
        )
        twice = raw[:-1] + ', "x-note": 1, "x-note": 2}'
        refused(await post(r, twice.encode()), 400, "invalid-message", "x-note: given twice")

    run(tmp_path, body)


def test_400_schema_faults_name_the_field(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        refused(
            await post(r, status_message(key, hid, "1", "running")), 400, "invalid-message", "seq:"
        )
        unknown_status = status_message(key, hid, 1, "dancing")
        refused(await post(r, unknown_status), 400, "invalid-message", "status:")
        refused_no_reason = status_message(key, hid, 1, "refused")
        refused(await post(r, refused_no_reason), 400, "invalid-message", "reason:")
        needs = status_message(key, hid, 1, "negotiating", needs=["ph one"])
        refused(await post(r, needs), 400, "invalid-message", "needs:")
        mismatch = status_message(key, hid, 1, "running")
        mismatch["case"] = {"address": key, "key": "ticket=gs-2@help.example"}
        refused(await post(r, mismatch), 400, "invalid-message", "case.")
        not_object = {**mismatch, "id": "fresh-id", "case": "x"}
        refused(await post(r, not_object), 400, "invalid-message", "case:")

    run(tmp_path, body)


def test_404_unknown_case_and_unknown_handoff(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        other = "ticket=gs-99@help.example"
        refused(await post(r, status_message(other, hid, 1, "running")), 404, "unknown-case", other)
        refused(
            await post(r, status_message(key, "f" * 32, 1, "running")),
            404,
            "unknown-handoff",
            "f" * 32,
        )

    run(tmp_path, body)


def test_a_status_may_name_any_handoff_of_its_case_not_only_the_open_one(
    tmp_path: Path,
) -> None:
    async def body(r: Running) -> None:
        key, first = await r.open_callback_case()
        for seq, status in ((1, "running"), (2, "completed")):
            assert (await post(r, status_message(key, first, seq, status))).json() == {"ok": True}
        # The case's second handoff (to chat) is now its open one.
        await deliver(r.store, r.rt, key.replace("@", "!chat@"), r.clock.now())
        rows = await r.store.read(
            lambda db: db.execute("SELECT mode, handoff_id FROM handoffs").fetchall()
        )
        second = dict(rows)["chat"]
        # The closed first handoff is judged as itself: stale, then no transition after completed.
        stale = await post(r, status_message(key, first, 2, "running"))
        assert stale.json() == {"ok": True, "ignored": "stale"}
        refused(await post(r, status_message(key, first, 3, "running")), 409, "invalid-transition")
        refused(await post(r, status_message(key, second, 1, "running")), 403, "forbidden", second)
        assert (await post(r, status_message(key, second, 1, "running"), CHAT)).json() == {
            "ok": True
        }
        # A handoff of another case is not one of this case.
        other_key, other = await r.open_callback_case()
        refused(
            await post(r, status_message(key, other, 1, "running")), 404, "unknown-handoff", other
        )
        statuses = await r.store.read(
            lambda db: db.execute("SELECT handoff_id, status FROM handoffs").fetchall()
        )
        assert dict(statuses) == {first: "completed", second: "running", other: "requested"}
        assert other_key != key

    run(tmp_path, body)


def test_403_for_a_handoff_sent_to_another_peer(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        refused(await post(r, status_message(key, hid, 1, "running"), CHAT), 403, "forbidden", hid)
        # The handoff is untouched; its own peer still may post.
        assert (await post(r, status_message(key, hid, 1, "running"))).json() == {"ok": True}

    run(tmp_path, body)


def test_stale_seq_is_ignored(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        assert (await post(r, status_message(key, hid, 5, "running"))).json() == {"ok": True}
        for seq in (5, 4):
            stale = await post(r, status_message(key, hid, seq, "completed"))
            assert stale.status_code == 200
            assert stale.json() == {"ok": True, "ignored": "stale"}
        doc = (await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(ADMIN))).json()
        assert doc["case"]["handoffs"][0]["status"] == "running"

    run(tmp_path, body)


def test_409_invalid_transitions(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        # A mode is never the timeout owner.
        refused(await post(r, status_message(key, hid, 1, "timed-out")), 409, "invalid-transition")
        # A transition the table does not allow.
        refused(await post(r, status_message(key, hid, 1, "completed")), 409, "invalid-transition")
        assert (await post(r, status_message(key, hid, 2, "running"))).status_code == 200
        assert (await post(r, status_message(key, hid, 3, "completed"))).status_code == 200
        # Nothing follows a terminal status.
        for seq, status in ((4, "running"), (5, "failed"), (6, "cancelled")):
            refused(await post(r, status_message(key, hid, seq, status)), 409, "invalid-transition")
        thread = (await r.client.get(f"/mas/v0.1/cases/{key}/thread", headers=auth(ADMIN))).json()
        kinds = [e["kind"] for e in thread["entries"]]
        # The terminal status sent the participant a resume notice.
        assert kinds.count("mail.out") == 2  # acknowledgement, resume notice

    run(tmp_path, body)


def test_store_failure_is_503_and_healthz_follows(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        health = await r.client.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {"ok": True}
        key, hid = await r.open_callback_case()
        r.store.close()
        refused(await r.client.get("/healthz"), 503, "store", "store")
        failed = await post(r, status_message(key, hid, 1, "running"))
        refused(failed, 503, "unavailable")
        assert (
            int(failed.headers["retry-after"]) > 0
        )  # docs/protocol.md §9: the same id may come again
        refused(await r.client.get("/metrics"), 503, "unavailable")
        refused(
            await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(ADMIN)), 503, "unavailable"
        )
        # Refusals before the store still answer.
        refused(await post(r, {}, secret="nope"), 401, "unauthenticated")

    run(tmp_path, body)


# ---------------------------------------------------------------------- no 5xx for client input


async def raw_exchange(r: Running, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as bytes on a fresh connection; the status, headers and body."""
    host, port = r.server.addresses[0]
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        }
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
        return status, headers, body
    finally:
        writer.close()
        await writer.wait_closed()


def http_request(method: str, path: str, authorization: bytes, body: bytes = b"") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: masd\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n".encode()
        + b"Authorization: "
        + authorization
        + b"\r\n\r\n"
        + body
    )


MALFORMED_AUTHORIZATION = [
    b"Bearer \xff",
    b"Bearer \xc3\xa9t\xc3\xa9",
    b"Bearer caf\xe9",
    b"Bearer",
    b"Bearer    ",
    b"bearer a b",
    b"Basic dXNlcjpwYXNz",
    b"\xff\xfe",
    b"Token " + CALLBACK.encode(),
]


@pytest.mark.parametrize("authorization", MALFORMED_AUTHORIZATION)
def test_a_malformed_authorization_header_is_401_everywhere(
    tmp_path: Path, authorization: bytes
) -> None:
    async def body(r: Running) -> None:
        message = json.dumps(status_message("k", "h", 1, "running")).encode()
        for method, path, payload in (
            ("POST", MESSAGES, message),
            ("GET", "/mas/v0.1/cases/ticket=gs-1@help.example", b""),
            ("GET", "/mas/v0.1/cases/ticket=gs-1@help.example/thread", b""),
        ):
            status, headers, raw = await raw_exchange(
                r, http_request(method, path, authorization, payload)
            )
            assert status == 401, (method, path, raw)
            assert json.loads(raw)["error"] == "unauthenticated"
            assert headers["www-authenticate"].startswith("Bearer")

    run(tmp_path, body)


def test_a_control_character_in_a_header_is_400_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(r: Running) -> None:
        status, _, raw = await raw_exchange(
            r, http_request("POST", MESSAGES, b"Bearer \x01secret", b"{}")
        )
        assert status == 400, raw  # not HTTP (RFC 9110 5.5): the HTTP parser refuses it

    with caplog.at_level(logging.INFO):
        run(tmp_path, body)
    (line,) = [r for r in caplog.records if "not a valid HTTP request" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert line.exc_info is None
    assert "Invalid header value char" in line.getMessage()


def _nested(depth: int) -> bytes:
    return b'{"detail": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


#: (JSON text, the field the refusal names, words of the refusal).
UNKEEPABLE_JSON = [
    (_nested(33), "detail", "nested deeper than 32"),
    (_nested(2000), "body", "nested deeper than 32"),
    (b'{"seq": ' + b"7" * 5000 + b"}", "seq", "outside"),
    (b'{"seq": 9007199254740993}', "seq", "outside"),
    (b'{"seq": -9007199254740993}', "seq", "outside"),
    (b'{"detail": "\\ud800"}', "detail", "unpaired surrogate"),
    (b'{"detail": "ok \\udc00 then"}', "detail", "unpaired surrogate"),
    (b'{"body": "a\\u0000b"}', "body", "NUL"),
    (b'{"case": {"key": "\\udfff"}}', "case.key", "unpaired surrogate"),
    (b'{"needs": ["phone", "\\ud83d"]}', "needs[1]", "unpaired surrogate"),
    (b'{"seq": 1, "seq": 2}', "seq", "given twice"),
    (b'{"case": {"key": "a", "key": "b"}}', "case.key", "given twice"),
    (b'{"detail": 1e999}', "detail", "too large"),
    (b'{"x-note": {"k": "a\\u0000b"}}', "x-note.k", "NUL"),
    (b'{"x-note": [1, 1, 1, 1, 9007199254740993]}', "x-note[4]", "outside"),
    (b'{"x-note": {"k": 1, "k": 1}}', "x-note.k", "given twice"),
    (b'{"detail": NaN}', "body", "not JSON"),
    (b"\xff\xfe{}", "body", "not UTF-8"),
]


@pytest.mark.parametrize(("raw", "field", "words"), UNKEEPABLE_JSON)
def test_json_masd_cannot_keep_is_400_naming_the_field(
    tmp_path: Path, raw: bytes, field: str, words: str
) -> None:
    async def body(r: Running) -> None:
        envelope = b'{"mas_modes_version": "0.1", "type": "handoff.status", "id": "x1", '
        message = envelope + raw[1:] if raw.startswith(b"{") else raw
        status, _, answer = await raw_exchange(
            r, http_request("POST", MESSAGES, f"Bearer {CALLBACK}".encode(), message)
        )
        assert status == 400, answer
        refusal = json.loads(answer)
        assert refusal["error"] == "invalid-message"
        assert refusal["detail"].startswith(f"{field}:"), refusal
        assert words in refusal["detail"]

    run(tmp_path, body)


def test_what_masd_can_keep_still_passes(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        bounds = status_message(key, hid, 1, "running", detail="\U0001f600 a \u00e9 b")
        bounds["extra"] = {"deep": [[[[1, -(2**53), 2**53]]]]}
        response = await post(r, bounds)
        assert response.status_code == 200, response.text

    run(tmp_path, body)


# --------------------------------------------------------------------------- routes and protocol


def test_unknown_paths_and_methods_answer_json(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        refused(await r.client.get("/nothing/here"), 404, "not-found", "/nothing/here")
        refused(await r.client.post("/x"), 404, "not-found")
        wrong = await r.client.get(MESSAGES)
        refused(wrong, 405, "method-not-allowed", "GET")
        assert "POST" in wrong.headers["allow"]
        refused(await r.client.delete("/healthz"), 405, "method-not-allowed")
        assert set(REPLIES.values()) >= {401, 413, 415, 503}

    run(tmp_path, body)


async def _raw_request(port: int, head: bytes) -> bytes:
    """Send request headers only and return the first line of what comes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


def test_expect_100_continue_only_invites_a_body_that_will_be_read(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        first = r.server.addresses[0]
        assert isinstance(first, tuple)
        port = first[1]

        def head(secret: str, length: int = 2) -> bytes:
            return (
                f"POST {MESSAGES} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {secret}\r\nContent-Length: {length}\r\n"
                "Expect: 100-continue\r\n\r\n"
            ).encode()

        assert (await _raw_request(port, head("wrong"))).startswith(b"HTTP/1.1 401")
        too_big = await _raw_request(port, head(CALLBACK, MAX_BODY + 1))
        assert too_big.startswith(b"HTTP/1.1 413")
        assert (await _raw_request(port, head(CALLBACK))).startswith(b"HTTP/1.1 100")

    run(tmp_path, body)


def test_unix_socket_listener(tmp_path: Path) -> None:
    sock = tmp_path / "http.sock"

    async def body(r: Running) -> None:
        assert r.server.addresses == [str(sock)]
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        assert (await r.client.get("/healthz")).json() == {"ok": True}
        refused(await post(r, {}, secret="nope"), 401, "unauthenticated")

    run(tmp_path, body, listen=UnixListen(sock))


# --------------------------------------------------------------------------- metrics

_SAMPLE = re.compile(
    r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? -?[0-9.e+]+'
)


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert _SAMPLE.fullmatch(line), f"not a sample line: {line!r}"
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


def test_metrics_text_format_and_store_gauges(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case()
        await post(r, status_message(key, hid, 1, "running"))
        await post(r, {}, secret="nope")
        # A second case, opened by another sender (acknowledged by mail).
        await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender="bot@example.com")
        response = await r.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        samples = parse_metrics(response.text)
        assert samples['masd_http_requests_total{status="200"}'] == 1
        assert samples['masd_http_requests_total{status="401"}'] == 1
        assert samples['masd_handoffs{status="running"}'] == 1
        assert samples['masd_handoffs{status="completed"}'] == 0
        assert samples['masd_handoff_statuses{status="requested"}'] == 1
        assert samples['masd_handoff_statuses{status="running"}'] == 1
        # Acknowledgements for both cases wait in the outbox, with the handoff.request.
        assert samples['masd_outbox_depth{kind="mail",state="pending"}'] == 2
        assert samples['masd_outbox_depth{kind="contract",state="pending"}'] == 1
        assert samples['masd_outbox_depth{kind="contract",state="failed"}'] == 0
        assert samples['masd_outbox_retries{kind="contract"}'] == 0
        for line in response.text.splitlines():
            if line.startswith("# TYPE masd_handoffs "):
                assert line.endswith(" gauge")

    run(tmp_path, body)


def test_metrics_count_refused_sends_and_retries(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        _key, _hid = await r.open_callback_case()

        def age_outbox(db: Any) -> None:
            db.execute("UPDATE outbox SET attempts = 3 WHERE kind = 'contract'")
            db.execute("UPDATE outbox SET state = 'failed', attempts = 1 WHERE kind = 'mail'")

        await r.store.write(age_outbox)
        # The participant's address is capped: 10 mails a day per recipient.
        for n in range(10):
            await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), subject=f"n{n}")
        samples = parse_metrics((await r.client.get("/metrics")).text)
        assert samples['masd_sends_refused{reason="send-cap-reached"}'] == 1
        assert samples['masd_outbox_retries{kind="contract"}'] == 3
        assert samples['masd_outbox_depth{kind="mail",state="failed"}'] == 1
        assert samples['masd_outbox_depth{kind="mail",state="pending"}'] == 9

    run(tmp_path, body)


# --------------------------------------------------------------------------- read side


def test_read_side_needs_the_admin_secret(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, _ = await r.open_callback_case()
        path = f"/mas/v0.1/cases/{key}"
        refused(await r.client.get(path), 401, "unauthenticated", "no Bearer")
        # A mode endpoint's secret is known, and reads nothing (docs/protocol.md §16.10).
        refused(await r.client.get(path, headers=auth(CALLBACK)), 403, "forbidden", "mode")
        refused(await r.client.get(path + "/thread", headers=auth("x")), 401, "unauthenticated")
        ok = await r.client.get(path, headers=auth(ADMIN))
        assert ok.status_code == 200
        case = ok.json()["case"]
        assert case["address"] == key
        assert case["key"] == key
        assert case["role"] == "master"
        assert case["participant"] == "alice@example.com"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", case["created_at"])
        refused(
            await r.client.get("/mas/v0.1/cases/ticket=gs-7@help.example", headers=auth(ADMIN)),
            404,
            "unknown-case",
        )
        refused(
            await r.client.get(
                "/mas/v0.1/cases/ticket=gs-7@help.example/thread", headers=auth(ADMIN)
            ),
            404,
            "unknown-case",
        )

    run(tmp_path, body)


def test_read_side_closed_without_an_admin_token(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, _ = await r.open_callback_case()
        response = await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(ADMIN))
        refused(response, 401, "unauthenticated", "no admin token is configured")
        for headers in ({"Authorization": "Bearer"}, {}):
            response = await r.client.get(f"/mas/v0.1/cases/{key}", headers=headers)
            refused(response, 401, "unauthenticated", "no Bearer")
        response = await r.client.get(f"/mas/v0.1/cases/{key}", headers=auth(CALLBACK))
        refused(response, 403, "forbidden", "reads nothing")

    run(tmp_path, body, admin=False)


def test_read_side_key_percent_encoded_and_any_spelling(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, _ = await r.open_callback_case()
        for spelled in ("ticket%3Dgs-1%40help.example", "ticket=GS-1@Help.Example"):
            response = await r.client.get(f"/mas/v0.1/cases/{spelled}", headers=auth(ADMIN))
            assert response.status_code == 200, response.text
            assert response.json()["case"]["key"] == key
        thread = await r.client.get(
            "/mas/v0.1/cases/ticket%3Dgs-1%40help.example/thread", headers=auth(ADMIN)
        )
        assert thread.json()["entries"][0]["kind"] == "mail.in"

    run(tmp_path, body)


def test_thread_pagination(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, _hid = await r.open_callback_case()
        for n in range(3):
            await deliver(r.store, r.rt, f"{key}", r.clock.now(), subject=f"follow-up {n}")
        path = f"/mas/v0.1/cases/{key}/thread"
        everything = (await r.client.get(path, headers=auth(ADMIN))).json()
        seqs = [e["seq"] for e in everything["entries"]]
        assert seqs == list(range(1, len(seqs) + 1))
        assert everything["next"] == seqs[-1]
        pages: list[int] = []
        after = 0
        while True:
            page = (
                await r.client.get(path, params={"after": after, "limit": 2}, headers=auth(ADMIN))
            ).json()
            assert len(page["entries"]) <= 2
            if not page["entries"]:
                assert page["next"] == after
                break
            pages += [e["seq"] for e in page["entries"]]
            assert page["next"] == page["entries"][-1]["seq"]
            after = page["next"]
        assert pages == seqs
        beyond = (await r.client.get(path, params={"after": 10_000}, headers=auth(ADMIN))).json()
        assert beyond == {"entries": [], "next": 10_000}
        subjects = [e["subject"] for e in everything["entries"] if e["kind"] == "mail.in"]
        assert subjects == ["Printer jams", "follow-up 0", "follow-up 1", "follow-up 2"]
        for params, name in (
            ({"after": "-1"}, "after"),
            ({"after": "x"}, "after"),
            ({"limit": "0"}, "limit"),
            ({"limit": "1001"}, "limit"),
            ({"limit": "1.5"}, "limit"),
        ):
            response = await r.client.get(path, params=params, headers=auth(ADMIN))
            refused(response, 400, "invalid-message", f"{name}:")
        assert (
            await r.client.get(path, params={"limit": "1000"}, headers=auth(ADMIN))
        ).status_code == 200

    run(tmp_path, body)


def test_readside_functions_and_operator_text(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        key, hid = await r.open_callback_case(subject='Printer "jams"\tagain')
        await post(r, status_message(key, hid, 1, "negotiating", needs=["phone"]))
        await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender="bob@example.org")
        case = await r.store.read(lambda db: readside.case_json(db, key))
        thread = await r.store.read(lambda db: readside.thread_json(db, key, 0, 100))
        assert case is not None
        assert thread is not None
        assert (
            await r.store.read(lambda db: readside.case_json(db, "ticket=gs-9@help.example"))
            is None
        )
        assert await r.store.read(lambda db: readside.thread_json(db, "nonsense", 0, 10)) is None
        text = format_case(case, thread)
        lines = text.splitlines()
        assert lines[0].startswith(f"case {key}")
        assert any(hid in line and "negotiating" in line for line in lines)
        mail_in = next(line for line in lines if "  mail.in " in line)
        assert re.match(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  mail\.in +from alice@example\.com ", mail_in
        )
        assert '"Printer \\"jams\\"\\x09again"' in mail_in
        assert "!callback" in mail_in
        assert any("  status " in line and "needs=phone" in line for line in lines)
        assert any("  contract.out " in line and "handoff.request" in line for line in lines)
        assert any("  mail.out " in line and "to alice@example.com" in line for line in lines)
        assert len([line for line in lines if re.match(r"\d{4}-", line)]) == len(thread["entries"])
        doc = await r.store.read(lambda db: readside.cases_json(db, None, 10))
        cases = doc["cases"]
        assert [c["key"] for c in cases] == ["ticket=gs-2@help.example", key]
        assert cases[1]["open_handoff"] == {
            "handoff_id": hid,
            "mode": "callback",
            "status": "negotiating",
        }
        assert cases[0]["open_handoff"] is None
        other = readside.CaseFilter(domain="other.example")
        assert (await r.store.read(lambda db: readside.cases_json(db, None, 10, other)))[
            "cases"
        ] == []
        mine = readside.CaseFilter(domain="help.example")
        one = await r.store.read(lambda db: readside.cases_json(db, None, 1, mine))
        assert len(one["cases"]) == 1
        assert one["next"] is not None

    run(tmp_path, body)


@pytest.mark.parametrize("after", [0, 3])
def test_thread_json_pages_from_after(tmp_path: Path, after: int) -> None:
    async def body(r: Running) -> None:
        key, _ = await r.open_callback_case()
        doc = await r.store.read(lambda db: readside.thread_json(db, key, after, 5000))
        assert doc is not None
        assert all(e["seq"] > after for e in doc["entries"])
        assert doc["next"] == (doc["entries"][-1]["seq"] if doc["entries"] else after)

    run(tmp_path, body)
