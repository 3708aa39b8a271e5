"""The two integrator examples of docs/protocol.md §21 run as written against a real masd.

Each is taken from the Markdown as it stands, written to a file and run with the system's
Python as a child process on loopback, configured by its environment only. The mode endpoint
gets a handoff from mail to ``ticket!callback@``, and masd's read side must show it
``completed`` with the mode's statuses (the first with ``seq`` 0). The master gets a
``case.intake`` from mail to ``case@``, assigns it, and its ``mail.send`` must reach the
participant through the relay, replying to the intake's mail.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.integrator import MASTER_EXAMPLE, MODE_EXAMPLE, example, running

from masd.testing import lmtpclient
from masd.testing.config import DOMAIN, server_table, write_config
from masd.testing.inbound import mx_mail
from masd.testing.net import free_ports
from masd.testing.peers import SmtpSink
from masd.testing.process import MasdProcess
from masd.testing.wait import wait_until

ALICE = "alice@example.com"


@pytest.mark.parametrize("heading", [MODE_EXAMPLE, MASTER_EXAMPLE])
def test_each_example_is_under_100_lines(heading: str) -> None:
    code = example(heading)
    assert len(code.splitlines()) < 100
    compile(code, heading, "exec")


def _setup(tmp_path: Path, types: dict[str, Any], smtp_port: int) -> tuple[Path, int, int]:
    lmtp_port, http_port = free_ports(2)
    server = server_table(lmtp_port=lmtp_port, http_port=http_port, smtp_port=smtp_port)
    server["public_url"] = f"http://127.0.0.1:{http_port}"
    tokens = {"admin": "admin-" + secrets.token_hex(16), "peer": "peer-" + secrets.token_hex(16)}
    config = write_config(
        tmp_path / "masd", {"server": server, "domains": {DOMAIN: {"types": types}}}, tokens
    )
    return config, lmtp_port, http_port


async def _mail(lmtp_port: int, rcpt: str, body: str) -> str:
    message_id, data = mx_mail(ALICE, rcpt, subject="Printer jams", body=body)
    result = await lmtpclient.deliver(("127.0.0.1", lmtp_port), ALICE, [rcpt], data)
    assert result.codes == (250,), result
    return message_id


def _admin(config: Path) -> dict[str, str]:
    token = (config.parent / "secrets" / "admin.token").read_text().strip()
    return {"Authorization": f"Bearer {token}"}


def test_the_mode_endpoint_example_completes_a_handoff(tmp_path: Path) -> None:
    (mode_port,) = free_ports(1)
    types = {
        "ticket": {
            "role": "master",
            "modes": ["callback"],
            "id_prefix": "gs-",
            "endpoints": {
                "callback": {
                    "url": f"http://127.0.0.1:{mode_port}/mas",
                    "token_file": "secrets/peer.token",
                    "deadline": "1h",
                    "fields": ["phone"],
                }
            },
        }
    }

    async def main() -> None:
        async with SmtpSink() as sink:
            config, lmtp_port, http_port = _setup(tmp_path, types, sink.port)
            env = {
                "MODE_PORT": str(mode_port),
                "MODE_TOKEN_FILE": str(config.parent / "secrets" / "peer.token"),
            }
            async with (
                MasdProcess(config, tmp_path / "masd.log") as masd,
                running(tmp_path, example(MODE_EXAMPLE), env, mode_port) as mode,
            ):
                await _mail(lmtp_port, "ticket!callback@help.example", "phone: +1 555 0100\n")
                url = f"http://127.0.0.1:{http_port}/mas/v0.1/cases/ticket=gs-1@help.example"
                async with httpx.AsyncClient(headers=_admin(config), timeout=10) as client:

                    async def completed() -> bool:
                        got = await client.get(url)
                        handoffs = got.json()["case"]["handoffs"] if got.status_code == 200 else []
                        return bool(handoffs) and handoffs[0]["status"] == "completed"

                    await wait_until(completed, "the handoff completed", timeout=30)
                    thread = (await client.get(url + "/thread")).json()["entries"]
                statuses = [
                    (e["status"], e.get("status_seq")) for e in thread if e["kind"] == "status"
                ]
                assert statuses == [("requested", None), ("running", 0), ("completed", 1)]
                assert mode.running, mode.log()
            assert "Traceback" not in masd.log()

    asyncio.run(main())


def test_the_master_example_assigns_and_answers_an_intake(tmp_path: Path) -> None:
    (master_port,) = free_ports(1)
    types = {
        "case": {
            "role": "slave",
            "master": {
                "url": f"http://127.0.0.1:{master_port}/mas",
                "token_file": "secrets/peer.token",
            },
        }
    }

    async def main() -> None:
        async with SmtpSink() as sink:
            config, lmtp_port, http_port = _setup(tmp_path, types, sink.port)
            env = {
                "MASTER_PORT": str(master_port),
                "MASTER_TOKEN_FILE": str(config.parent / "secrets" / "peer.token"),
                "MASD_URL": f"http://127.0.0.1:{http_port}",
            }
            async with (
                MasdProcess(config, tmp_path / "masd.log") as masd,
                running(tmp_path, example(MASTER_EXAMPLE), env, master_port) as master,
            ):
                message_id = await _mail(lmtp_port, "case@help.example", "It jams on every page.\n")
                (reply,) = await sink.wait_for(1, timeout=30)
                assert reply.rcpt_tos == (ALICE,)
                assert reply.message["From"] == "case=CRM-1@help.example"
                assert reply.message["In-Reply-To"] == message_id
                assert "Your request is CRM-1" in reply.message.get_body(("plain",)).get_content()
                url = f"http://127.0.0.1:{http_port}/mas/v0.1/cases/case=CRM-1@help.example"
                async with httpx.AsyncClient(headers=_admin(config), timeout=10) as client:
                    got = await client.get(url)
                assert got.status_code == 200, got.text
                assert got.json()["case"]["sent"] == 1
                assert master.running, master.log()
            assert "Traceback" not in masd.log()

    asyncio.run(main())
