"""``server.peer_timeout`` (docs/protocol.md §10): how long masd waits for a peer's
answer; a peer that does not answer in time is retried like one that answered 5xx."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.masd_process import WAIT, MasdProcess, mx_mail, wait_until
from support.slave import write_slave_config

from masd.config import ConfigErrors, load_config
from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, Recorded, SmtpSink


def configured(tmp_path: Path, line: str) -> Path:
    setup = write_slave_config(
        tmp_path,
        master_url="http://127.0.0.1:9/crm",
        webhook_url="http://127.0.0.1:9/h/",
        smtp_port=9,
    )
    setup.config.write_text(setup.config.read_text().replace("[server]\n", f"[server]\n{line}"))
    return setup.config


def test_peer_timeout_is_ten_seconds_unless_configured(tmp_path: Path) -> None:
    assert load_config(configured(tmp_path / "a", "")).server.peer_timeout == 10.0
    got = load_config(configured(tmp_path / "b", 'peer_timeout = "2m"\n'))
    assert got.server.peer_timeout == 120.0
    with pytest.raises(ConfigErrors) as refused:
        load_config(configured(tmp_path / "c", 'peer_timeout = "0s"\n'))
    assert "server.peer_timeout" in str(refused.value.errors[0])


def test_a_peer_that_does_not_answer_in_time_is_tried_again(tmp_path: Path) -> None:
    calls: list[str] = []

    async def slow_first(rec: Recorded) -> tuple[int, object]:
        calls.append(str((rec.json or {}).get("id")))
        if len(calls) == 1:
            await asyncio.sleep(5)  # past the 1 s peer_timeout
        return 200, {"ok": True}

    async def main() -> None:
        async with FakePeer(slow_first) as crm, SmtpSink() as sink:
            setup = write_slave_config(
                tmp_path / "masd",
                master_url=crm.url + "crm",
                webhook_url=crm.url + "hooks/",
                smtp_port=sink.port,
            )
            text = setup.config.read_text()
            setup.config.write_text(text.replace("[server]\n", '[server]\npeer_timeout = "1s"\n'))
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                data = mx_mail("ann@example.org", "case@help.example")[1]
                result = await lmtpclient.deliver(
                    ("127.0.0.1", setup.lmtp_port),
                    "ann@example.org",
                    ["case@help.example"],
                    data,
                    timeout=WAIT,
                )
                assert result.codes == (250,)
                await wait_until(lambda: len(calls) >= 2, "case.intake tried again")
                assert calls[0] == calls[1]  # the same message, the same id
                await wait_until(lambda: "HTTP 200" in masd.log(), "the retry delivered")
                assert "timed out" in masd.log().lower() or "timeout" in masd.log().lower()
                await masd.terminate()

    asyncio.run(main())
