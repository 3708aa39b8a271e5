"""Fuzzing the listeners of a running masd (hypothesis, real sockets on loopback).

One masd process serves the whole module: a master type (``ticket``, mode
``callback``) and a slave type (``case``), with one case, one handoff and
one intake recorded before the fuzzing starts so that messages can reach
past ``404``.  Then:

- arbitrary bytes, arbitrary JSON and envelope-shaped JSON are posted to
  ``POST /mas/v0.1/messages`` as a mode and as a master, and arbitrary
  header bytes go in raw requests: never a 5xx but ``503 unavailable``
  (a store fault), every answer JSON;
- arbitrary bytes and command sequences go to the LMTP listener: every
  reply is a well-formed reply line, never a ``451`` (masd's own fault);
  mail with lines of any length is recorded (``250``);
- afterwards masd still runs, ``/healthz`` is 200, mail is still
  recorded, and its log holds no traceback.

Examples are bounded (a few hundred per test, no deadline) so the module
takes seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.masd_process import (
    DOMAIN,
    MasdProcess,
    free_port,
    mx_mail,
    server_section,
    write_secret,
)

from masd.core.status import MACHINE
from masd.core.wire import TYPES
from masd.testing import lmtpclient

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TIMEOUT = 10.0
ANN = "ann@example.org"
REPLY_LINE = re.compile(rb"[2-5][0-9]{2}[ -][^\r\n]*")


@dataclass(frozen=True)
class Running:
    masd: MasdProcess
    lmtp_port: int
    http_port: int
    tokens: dict[str, str]
    case: str  # a case with a handoff to callback
    handoff_id: str
    intake_ref: str  # a slave-role intake not yet assigned
    message_id: str  # a mail of the case (mail.send may reply to it)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def write_config(directory: Path) -> tuple[Path, int, int, dict[str, str]]:
    tokens = {name: f"{name}-fuzz-secret" for name in ("admin", "callback", "crm")}
    for name, value in tokens.items():
        write_secret(directory / "secrets" / f"{name}.token", value)
    server, lmtp_port, http_port = server_section(free_port(), "1h")
    config = directory / "masd.toml"
    config.write_text(
        server
        + f"""
[domains."{DOMAIN}".types.ticket]
role = "master"
modes = ["callback"]

[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "http://127.0.0.1:9/mas"
token_file = "secrets/callback.token"
deadline = "1h"
fields = ["phone"]

[domains."{DOMAIN}".types.case]
role = "slave"
master = {{ url = "http://127.0.0.1:9/crm", token_file = "secrets/crm.token" }}
"""
    )
    return config, lmtp_port, http_port, tokens


async def _prepare(directory: Path) -> Running:
    config, lmtp_port, http_port, tokens = write_config(directory)
    masd = MasdProcess(config, directory / "masd.log")
    await masd.start()
    lmtp = ("127.0.0.1", lmtp_port)
    message_id, mail = mx_mail(ANN, "ticket!callback@help.example", body="phone: 1\n")
    assert (await lmtpclient.deliver(lmtp, ANN, ["ticket!callback@help.example"], mail)).codes == (
        250,
    )
    _, intake = mx_mail(ANN, "case@help.example")
    assert (await lmtpclient.deliver(lmtp, ANN, ["case@help.example"], intake)).codes == (250,)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    case = "ticket=ticket-1@help.example"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", headers=admin) as c:
        doc = (await c.get(f"/mas/v0.1/cases/{quote(case, safe='')}")).json()["case"]
        handoff_id = doc["handoffs"][0]["handoff_id"]
    intake_ref = _intake_ref(directory / "masd.db")
    return Running(masd, lmtp_port, http_port, tokens, case, handoff_id, intake_ref, message_id)


def _intake_ref(database: Path) -> str:
    import sqlite3

    with sqlite3.connect(database) as db:
        (ref,) = db.execute("SELECT intake_ref FROM intakes").fetchone()
    return str(ref)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("fuzz")
    started = asyncio.run(_prepare(directory))
    try:
        yield started
        assert started.masd.running, started.masd.log()
        with httpx.Client(base_url=started.http, timeout=TIMEOUT) as client:
            health = client.get("/healthz")
        assert health.status_code == 200, health.text
        log = started.masd.log()
        assert "Traceback" not in log, log[-5000:]
        assert asyncio.run(started.masd.terminate()) == 0, started.masd.log()[-5000:]
    finally:
        started.masd.kill()
        started.masd.close()


# --------------------------------------------------------------------------- HTTP


def check_answer(response: httpx.Response) -> None:
    """Never a 5xx but 503 unavailable for a store fault; always a JSON object."""
    assert response.status_code < 500 or response.status_code == 503, response.text
    body = response.json()
    assert isinstance(body, dict)
    assert isinstance(body["ok"], bool)
    if response.status_code >= 400:
        assert body["ok"] is False
        assert isinstance(body["error"], str)
    if response.status_code == 503:
        assert body["error"] == "unavailable"
        assert body["detail"].startswith("store"), body  # not masd failing on the input
        assert int(response.headers["retry-after"]) > 0


@pytest.fixture(scope="module")
def client(running: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.http, timeout=TIMEOUT) as session:
        yield session


def post(client: httpx.Client, running: Running, body: bytes, peer: str) -> httpx.Response:
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {running.tokens[peer]}",
    }
    return client.post("/mas/v0.1/messages", content=body, headers=headers)


PEERS = st.sampled_from(["callback", "crm"])
TRICKY_TEXT = st.sampled_from(["", "\ud800", "a\x00b", "\udfff\ud800", "é" * 300, "x" * 5000])
TEXT = st.text(max_size=40) | TRICKY_TEXT
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | TEXT
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=25,
)


@given(body=st.binary(max_size=2048), peer=PEERS)
@FUZZ
def test_arbitrary_bytes_are_refused_by_name(
    running: Running, client: httpx.Client, body: bytes, peer: str
) -> None:
    check_answer(post(client, running, body, peer))


@given(value=JSON, peer=PEERS)
@settings(FUZZ, max_examples=200)
def test_arbitrary_json_is_refused_by_name(
    running: Running, client: httpx.Client, value: Any, peer: str
) -> None:
    check_answer(post(client, running, json.dumps(value).encode(), peer))


_STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {}


def _envelopes(running: Running) -> st.SearchStrategy[dict[str, Any]]:
    case = {"address": running.case, "key": running.case}
    fields: dict[str, st.SearchStrategy[Any]] = {
        "case": st.just(case) | JSON,
        "handoff_id": st.just(running.handoff_id) | JSON,
        "seq": st.integers(min_value=-2, max_value=2**54) | JSON,
        "status": st.sampled_from(sorted(MACHINE.statuses)) | JSON,
        "needs": st.lists(st.sampled_from(["phone", "time", "Phone"]), max_size=3) | JSON,
        "at": st.just("2026-11-29T19:50:01Z") | JSON,
        "outcome": TEXT | JSON,
        "reason": st.sampled_from(["declined", "blocked", "out-of-hours"]) | JSON,
        "detail": TEXT | JSON,
        "intake_ref": st.just(running.intake_ref) | JSON,
        "resource_id": st.text(alphabet="abc-0123", min_size=1, max_size=10) | JSON,
        "policy": st.fixed_dictionaries(
            {},
            optional={
                "autonomous_send": st.booleans() | JSON,
                "transfers": st.just("block") | JSON,
            },
        )
        | JSON,
        "in_reply_to": st.just(running.message_id) | JSON,
        "subject": TEXT | JSON,
        "body": TEXT | JSON,
    }
    return st.fixed_dictionaries(
        {
            "mas_modes_version": st.just("0.1") | JSON,
            "type": st.sampled_from(sorted(TYPES)) | JSON,
            "id": st.text(alphabet="0123456789abcdef", min_size=1, max_size=12) | JSON,
        },
        optional=fields,
    )


@pytest.mark.slow
@given(data=st.data(), peer=PEERS)
@settings(FUZZ, max_examples=200)
def test_envelope_shaped_json_never_fails_masd(
    running: Running, client: httpx.Client, data: st.DataObject, peer: str
) -> None:
    strategy = _STRATEGIES.setdefault(running.case + running.handoff_id, _envelopes(running))
    message = data.draw(strategy)
    check_answer(post(client, running, json.dumps(message).encode(), peer))


HEADER_BYTES = st.binary(max_size=300).map(lambda b: b.replace(b"\r\n\r\n", b"\r\n"))


@given(head=HEADER_BYTES, body=st.binary(max_size=200))
@settings(FUZZ, max_examples=150)
def test_arbitrary_header_bytes_never_yield_a_5xx(
    running: Running, head: bytes, body: bytes
) -> None:
    request = (
        b"POST /mas/v0.1/messages HTTP/1.1\r\nHost: masd\r\nConnection: close\r\n"
        + head
        + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    answer = exchange(running.http_port, request)
    if answer:  # a request the server reads as none at all may be closed unanswered
        assert REPLY_STATUS.match(answer), answer[:200]
        status = int(answer[9:12])
        assert status < 500 or status == 503, answer[:500]


REPLY_STATUS = re.compile(rb"HTTP/1\.[01] [1-5][0-9]{2} ")


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, end the sending side, read everything until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed on us early: what it wrote is still read below
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


# --------------------------------------------------------------------------- LMTP


COMMANDS = st.sampled_from(
    [
        b"LHLO mx.help.example",
        b"HELO mx",
        b"EHLO mx",
        b"MAIL FROM:<ann@example.org>",
        b"MAIL FROM:<>",
        b"MAIL FROM:<ann@example.org> SIZE=99999999999999999999",
        b"MAIL FROM:<\xff@example.org> SMTPUTF8",
        b"RCPT TO:<ticket@help.example>",
        b"RCPT TO:<ticket!callback@help.example>",
        b"RCPT TO:<ticket=ticket-1@help.example>",
        b"RCPT TO:<case@help.example>",
        b"RCPT TO:<nobody@elsewhere.example>",
        b"RCPT TO:<ticket=\xc3\xa9@help.example>",
        b"DATA",
        b".",
        b"RSET",
        b"NOOP",
        b"VRFY ann",
        b"QUIT",
        b"Subject: fuzz",
        b"List-Id: <l.example>",
        b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.org",
        b"",
    ]
)
LMTP_LINES = st.lists(COMMANDS | st.binary(max_size=120), max_size=25)


@given(lines=LMTP_LINES, tail=st.binary(max_size=300))
@settings(FUZZ, max_examples=250)
def test_arbitrary_lmtp_sessions_get_well_formed_replies(
    running: Running, lines: list[bytes], tail: bytes
) -> None:
    answer = exchange(running.lmtp_port, b"".join(line + b"\r\n" for line in lines) + tail)
    replies = answer.split(b"\r\n")
    assert replies[-1] == b"", answer[-200:]  # every reply is a whole line
    assert replies[0].startswith(b"220 "), answer[:200]
    for line in replies[:-1]:
        assert REPLY_LINE.fullmatch(line), line
        assert not line.startswith(b"451"), answer  # masd's own fault


#: Body lines of any length (most over the 1000 octets of RFC 5321 §4.5.3.1.6), any octet
#: but CR and LF.
LONG_LINES = st.lists(
    st.tuples(st.integers(min_value=0, max_value=20_000), st.binary(min_size=1, max_size=40)).map(
        lambda t: (t[1].replace(b"\r", b"x").replace(b"\n", b"y") * t[0])[: t[0]]
    ),
    min_size=1,
    max_size=6,
)


@given(lines=LONG_LINES)
@settings(FUZZ, max_examples=40)
def test_mail_with_lines_of_any_length_is_recorded(running: Running, lines: list[bytes]) -> None:
    # docs/protocol.md §3: no mail is refused for its content.
    _, mail = mx_mail(ANN, "ticket@help.example")
    mail += b"\r\n".join(lines) + b"\r\n"
    result = asyncio.run(
        lmtpclient.deliver(("127.0.0.1", running.lmtp_port), ANN, ["ticket@help.example"], mail)
    )
    assert [(r.final.code, r.final.enhanced) for r in result.recipients] == [(250, "2.0.0")]


def test_after_the_fuzzing_mail_is_still_recorded(running: Running) -> None:
    _, mail = mx_mail(ANN, "ticket@help.example")
    result = asyncio.run(
        lmtpclient.deliver(("127.0.0.1", running.lmtp_port), ANN, ["ticket@help.example"], mail)
    )
    assert result.codes == (250,)
