"""packaging/haproxy/masd.cfg in front of two masd hosts on one private PostgreSQL.

The shipped file is run by a real haproxy on loopback with only its ``bind`` line (a port
of its own, a self-signed certificate) and its ``server`` addresses (the two masd hosts'
HTTP listeners) changed.  Both hosts have the front's URL as ``server.public_url``.  A case
is worked through the front: mail to host A opens it and posts a ``handoff.request`` whose
``status_url`` is the front's; the mode's statuses go to the front, and the thread is read
through it.  The console stays signed in through the front (a browser is kept on the host
that signed it in).  Then A is killed with ``kill -9``: the front sends every request to B,
at once (a refused connection is tried on the other host), the case goes on, and a follower
of the event stream resumes through the front from the cursor it had (``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import csv
import json
import re
import secrets
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from support.masd_process import MasdProcess, MasterSetup, mx_mail
from support.postgres import Database, postgres_server, two_hosts  # noqa: F401
from support.postgres import postgres as postgres
from support.system import require_program

from masd.testing import FakePeer, Recorded, SmtpSink, lmtpclient
from masd.testing.net import free_ports
from masd.testing.wait import wait_until

pytestmark = [pytest.mark.fault]

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "packaging" / "haproxy" / "masd.cfg"
BIND = "bind :443 ssl crt /etc/haproxy/certs/mas.help.example.pem"
HOSTS = ("10.0.0.11:8025", "10.0.0.12:8025")
WAIT = 60.0


def front_config(directory: Path, port: int, hosts: tuple[int, int]) -> tuple[Path, Path]:
    """The shipped file with the test's addresses, a global section, and the certificate."""
    key, cert = directory / "front.key", directory / "front.crt"
    subprocess.run(
        [
            require_program("openssl"),
            *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    pem = directory / "front.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    text = SHIPPED.read_text()
    assert text.count(BIND) == 1
    text = text.replace(BIND, f"bind 127.0.0.1:{port} ssl crt {pem}")
    for shipped, port_of_host in zip(HOSTS, hosts, strict=True):
        assert text.count(f" {shipped}") == 2, shipped  # the API's backend and the console's
        text = text.replace(f" {shipped}", f" 127.0.0.1:{port_of_host}")
    cfg = directory / "front.cfg"
    cfg.write_text(text)
    top = directory / "global.cfg"
    top.write_text(
        "global\n    maxconn 256\n    log stderr format short local0\n"
        f"    stats socket {directory / 'haproxy.sock'} mode 600 level user\n"
    )
    return top, cfg


@pytest.fixture
def haproxy() -> str:
    return require_program("haproxy")


def hosts(
    directory: Path, db: Database, peer: FakePeer, sink: SmtpSink, public_url: str
) -> tuple[MasterSetup, MasterSetup]:
    return two_hosts(
        directory,
        db,
        endpoint_url=peer.url + "mas",
        smtp_port=sink.port,
        server_lines=f'claim_timeout = "2s"\npublic_url = "{public_url}"\nconsole = true\n',
    )


async def callback_mail(setup: MasterSetup) -> None:
    sender, rcpt = "alice@example.org", "ticket!callback@help.example"
    _, data = mx_mail(sender, rcpt, subject="Call me", body="phone: +1 555 0100\n")
    while True:  # as Postfix does: a temporary failure is tried again
        result = await lmtpclient.deliver(("127.0.0.1", setup.lmtp_port), sender, [rcpt], data)
        if result.codes == (250,):
            return
        await asyncio.sleep(0.5)


def status(request: Recorded, seq: int, state: str) -> dict[str, Any]:
    return {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": secrets.token_hex(16),
        "case": request.json["case"],
        "handoff_id": request.json["handoff_id"],
        "seq": seq,
        "status": state,
    }


class Front:
    """haproxy in the foreground (``-db``), stopped at the end."""

    def __init__(self, haproxy: str, top: Path, cfg: Path, log: Path) -> None:
        self._argv = [haproxy, "-db", "-f", str(top), "-f", str(cfg)]
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Front:
        with self._log.open("wb") as out:
            self._process = subprocess.Popen(self._argv, stdout=out, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._process is not None
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def log(self) -> str:
        return self._log.read_text(errors="replace")


def server_states(sock: Path) -> dict[str, str]:
    """``backend/server`` -> its state (``UP``, ``DOWN``, ...), from haproxy's runtime API."""
    if not sock.exists():
        return {}
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = list(csv.reader(data.decode().lstrip("# ").splitlines()))
    if not rows:
        return {}
    head = rows[0]
    at = {name: n for n, name in enumerate(head)}
    return {
        f"{r[at['pxname']]}/{r[at['svname']]}": r[at["status"]]
        for r in rows[1:]
        if len(r) == len(head) and r[at["svname"]] not in ("FRONTEND", "BACKEND")
    }


def all_up(sock: Path) -> bool:
    states = server_states(sock)
    return len(states) == 4 and set(states.values()) == {"UP"}


def test_two_hosts_behind_the_shipped_front(
    tmp_path: Path, postgres: Database, haproxy: str
) -> None:
    front_port = free_ports(1)[0]
    public_url = f"https://127.0.0.1:{front_port}"

    async def scenario() -> None:
        async with FakePeer() as peer, SmtpSink() as sink:
            a, b = hosts(tmp_path, postgres, peer, sink, public_url)
            top, cfg = front_config(tmp_path, front_port, (a.http_port, b.http_port))
            host_a = MasdProcess(a.config, tmp_path / "a.log")
            host_b = MasdProcess(b.config, tmp_path / "b.log")
            with Front(haproxy, top, cfg, tmp_path / "haproxy.log") as front:
                async with (
                    host_a,
                    host_b,
                    httpx.AsyncClient(
                        base_url=public_url,
                        verify=ssl.create_default_context(cafile=tmp_path / "front.crt"),
                        timeout=WAIT,
                    ) as http,
                ):
                    try:
                        sock = tmp_path / "haproxy.sock"
                        await wait_until(lambda: all_up(sock), "both hosts UP at the front", WAIT)
                        await work_a_case(http, public_url, peer, a, host_a)
                    except BaseException:
                        print(f"---- haproxy log ----\n{front.log()}")
                        raise

    asyncio.run(scenario())


async def up(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def work_a_case(
    http: httpx.AsyncClient, public_url: str, peer: FakePeer, a: MasterSetup, host_a: MasdProcess
) -> None:
    """Everything through the front; B's own address is never used."""
    await wait_until(lambda: up(http), "the front answering /healthz", WAIT)
    endpoint = {"Authorization": f"Bearer {a.endpoint_token}"}
    admin = {"Authorization": f"Bearer {a.admin_token}"}

    await callback_mail(a)
    [request] = await peer.wait_for(1, WAIT)
    assert request.json["status_url"] == public_url + "/mas/v0.1/messages"
    status_path = "/mas/v0.1/messages"
    key = quote(request.json["case"]["key"], safe="")
    posted = await http.post(status_path, json=status(request, 1, "scheduled"), headers=endpoint)
    assert posted.status_code == 200, posted.text

    # The console through the front: signed in once, every page after it is served.
    signed = await http.post("/console/sign-in", data={"secret": a.admin_token})
    assert signed.status_code == 303, signed.text
    assert signed.headers["location"].endswith("/console/cases")
    for _ in range(4):
        page = await http.get("/console/cases")
        assert page.status_code == 200, (page.status_code, page.headers.get("location"))

    # The event feed's cursor before A goes.
    feed = await http.get("/mas/v0.1/events", params={"limit": "1000"}, headers=admin)
    assert feed.status_code == 200, feed.text
    cursor = feed.json()["next"]

    # Host A down (kill -9): every request goes to B, the first one too.
    host_a.kill()
    for n in range(4):
        health = await http.get("/healthz")
        assert health.status_code == 200, (n, health.text)
    posted = await http.post(status_path, json=status(request, 2, "running"), headers=endpoint)
    assert posted.status_code == 200, posted.text
    thread = await http.get(f"/mas/v0.1/cases/{key}/thread", headers=admin)
    assert thread.status_code == 200, thread.text
    states = [e["status"] for e in thread.json()["entries"] if e["kind"] == "status"]
    assert states[-2:] == ["scheduled", "running"], states
    # A follower of the stream resumes through the front from its last cursor (on B now).
    stream_headers = {**admin, "Accept": "text/event-stream", "Last-Event-ID": cursor}
    async with http.stream("GET", "/mas/v0.1/events", headers=stream_headers) as stream:
        assert stream.status_code == 200
        event = await next_event(stream.aiter_lines())
    assert event["entry"]["kind"] == "status", event
    assert event["entry"]["status"] == "running", event


async def next_event(lines: AsyncIterator[str]) -> dict[str, Any]:
    """The data of the first event of a Server-Sent Events stream."""
    async for line in lines:
        if line.startswith("data:"):
            found: dict[str, Any] = json.loads(line[5:])
            return found
    raise AssertionError("the stream ended before an event")


def test_the_shipped_front_is_valid_haproxy(tmp_path: Path, haproxy: str) -> None:
    top, cfg = front_config(tmp_path, free_ports(1)[0], (8025, 8026))
    done = subprocess.run(
        [haproxy, "-c", "-f", str(top), "-f", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr, done.stdout + done.stderr


def test_operations_names_every_backend_of_the_front() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    assert "packaging/haproxy/masd.cfg" in guide
    backends = re.findall(r"^backend (\S+)", SHIPPED.read_text(), re.M)
    assert backends == ["masd", "masd_console"]
    for name in backends:
        assert f"`{name}`" in guide, name
