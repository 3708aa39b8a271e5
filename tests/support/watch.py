"""masd as a process with its peers, for the tests of what an operator watches and steers.

:func:`watched` starts a master-role masd (``python -m masd serve``) with a
fake callback endpoint and an SMTP sink on loopback, and an HTTP client
holding the admin secret; :meth:`Watched.cli` runs a ``masd`` command as a
subprocess against the same configuration, without blocking the event loop
the peers answer on.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, SmtpSink
from support.masd_process import (
    ROOT,
    WAIT,
    MasdProcess,
    MasterSetup,
    mx_mail,
    write_master_config,
)

ANN = "ann@example.org"
BOB = "bob@example.net"


@dataclass(frozen=True)
class Ran:
    """A finished ``masd`` command: exit code, stdout, stderr."""

    code: int
    out: str
    err: str


@dataclass
class Watched:
    setup: MasterSetup
    masd: MasdProcess
    endpoint: FakePeer
    sink: SmtpSink
    http: httpx.AsyncClient

    async def send(self, rcpt: str, sender: str = ANN, **kw: Any) -> str:
        """Deliver one mail over LMTP; it must be accepted (250).  Its Message-ID."""
        message_id, data = mx_mail(sender, rcpt, **kw)
        result = await lmtpclient.deliver(
            ("127.0.0.1", self.setup.lmtp_port), sender, [rcpt], data, timeout=WAIT
        )
        assert result.codes == (250,), result
        return message_id

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        response = await self.http.get(path, params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def all_events(self) -> list[dict[str, Any]]:
        """The whole feed from the start, page by page."""
        events: list[dict[str, Any]] = []
        after = None
        while True:
            params = {"limit": 1000} if after is None else {"limit": 1000, "after": after}
            page = await self.get("/mas/v0.1/events", **params)
            if not page["events"]:
                return events
            events += page["events"]
            after = page["next"]

    async def cli(self, *args: str, config: bool = True) -> Ran:
        """``masd ARGS --config FILE`` as a subprocess."""
        command = [sys.executable, "-m", "masd", *args]
        if config:
            command += ["--config", str(self.setup.config)]
        proc = await asyncio.create_subprocess_exec(
            *command,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return Ran(proc.returncode, out.decode(), err.decode())


@asynccontextmanager
async def watched(
    tmp_path: Path,
    *,
    args: Sequence[str] = (),
    endpoint: FakePeer | None = None,
    retry_for: str = "1h",
    deadline: str = "1h",
    more_config: str = "",
) -> AsyncIterator[Watched]:
    """masd (with ``args``, e.g. ``--test-clock``) and its peers; SIGTERM at the end exits 0.

    ``more_config``: TOML added to the configuration (more types, say).
    """
    peer = endpoint or FakePeer()
    async with peer, SmtpSink() as sink:
        setup = write_master_config(
            tmp_path / "masd",
            endpoint_url=peer.url + "mas",
            smtp_port=sink.port,
            modes=("callback", "chat"),
            retry_for=retry_for,
            deadline=deadline,
        )
        if more_config:
            setup.config.write_text(setup.config.read_text() + more_config)
        masd = MasdProcess(setup.config, tmp_path / "masd.log")
        masd.argv += args
        async with (
            masd,
            httpx.AsyncClient(
                base_url=setup.http_url,
                headers={"Authorization": f"Bearer {setup.admin_token}"},
                timeout=WAIT,
            ) as http,
        ):
            yield Watched(setup, masd, peer, sink, http)
            if masd.running:
                code = await masd.terminate()
                assert code == 0, masd.log()
