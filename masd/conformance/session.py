"""One flow's run: the fake peers, the sink, the target process and what arrived.

A :class:`FlowRun` starts the fake peers and the SMTP relay sink on
loopback, writes the standard configuration (patched by the flow's
``config``) with a secret per peer, starts the target and waits until it is
ready (``GET /healthz`` answers 200 and the LMTP port takes connections).
Contract messages the target sends are *held* by the fake peer as
:class:`Arrival` values until a step claims them and gives the answer.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from masd.conformance.match import MatchError, get_path, substitute
from masd.conformance.standard import apply_patch, standard_config
from masd.conformance.steps import PEERS, Flow
from masd.core.errors import MasdError
from masd.testing.client import MESSAGES_PATH, MasdClient
from masd.testing.config import DOMAIN, write_config
from masd.testing.net import free_ports, listening
from masd.testing.peers import FakePeer, Recorded, SmtpSink
from masd.testing.process import ChildProcess, ProcessStuck
from masd.testing.wait import poll

__all__ = ["Arrival", "FlowRun", "StepFailure", "Variables"]

#: Bound (real seconds) of starting the target.
READY_TIMEOUT: Final = 30.0
#: A held request not answered by then is answered 503 (the flow has long failed).
HOLD_LIMIT: Final = 60.0
_UNAVAILABLE: Final = {"ok": False, "error": "unavailable", "detail": "end"}


class StepFailure(MasdError):
    """What differed at one step (the flow fails there)."""

    code = "step-failed"


@dataclass
class Arrival:
    """A contract message the target sent to a fake peer; its answer waits for a step."""

    peer: str
    rec: Recorded
    reply: asyncio.Future[tuple[int, Any]]
    claimed: bool = False
    held: bool = False

    def describe(self) -> str:
        body = self.rec.json if isinstance(self.rec.json, dict) else {}
        return f"{body.get('type', '(not a contract message)')} to {self.peer}"


@dataclass
class Variables:
    values: dict[str, Any] = field(default_factory=dict)

    def lookup(self, name: str) -> Any:
        if name == "fresh":
            return secrets.token_hex(16)
        if name not in self.values:
            raise StepFailure(f"${{{name}}} has no value")
        return self.values[name]

    def fill(self, value: Any) -> Any:
        return substitute(value, self.lookup)


class FlowRun:
    """One flow against one fresh target process (``argv`` with ``--config FILE``)."""

    def __init__(
        self,
        flow: Flow,
        argv: Sequence[str],
        env: dict[str, str],
        workdir: Path,
        store: Mapping[str, Any] | None = None,
        store_secrets: Mapping[str, str] | None = None,
    ) -> None:
        """``store``: ``[server]`` keys naming the target's store (default: its own SQLite
        file); ``store_secrets``: the secrets they name."""
        self.flow = flow
        self.store = dict(store or {})
        self.store_secrets = dict(store_secrets or {})
        self.argv = list(argv)
        self.env = env
        self.dir = workdir
        self.vars = Variables()
        self.arrivals: list[Arrival] = []
        self.claimed_mail: set[int] = set()
        self.saved: dict[str, tuple[str, tuple[str, ...], bytes]] = {}
        self.tokens: dict[str, str] = {}
        self.peers: dict[str, FakePeer] = {}
        self.sink = SmtpSink()
        self.process: ChildProcess | None = None
        self.client: MasdClient | None = None
        self.lmtp_port = 0
        self.http_port = 0

    # -- set-up and tear-down -----------------------------------------------------

    def _script(self, name: str) -> Callable[[Recorded], Any]:
        async def answer(rec: Recorded) -> tuple[int, Any]:
            reply: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
            self.arrivals.append(Arrival(name, rec, reply))
            try:
                return await asyncio.wait_for(asyncio.shield(reply), HOLD_LIMIT)
            except TimeoutError:
                return 503, {"ok": False, "error": "unavailable", "detail": "never answered"}

        return answer

    async def setup(self) -> None:
        for name in PEERS:
            self.peers[name] = await FakePeer(self._script(name)).start()
        await self.sink.start()
        self.lmtp_port, self.http_port = free_ports(2)
        urls = {name: self.peers[name].url + "mas" for name in PEERS if name != "webhook"}
        urls["webhook"] = self.peers["webhook"].url + "hook/"
        self.tokens = {name: f"{name}-{secrets.token_hex(16)}" for name in (*PEERS, "admin")}
        config = standard_config(
            lmtp_port=self.lmtp_port,
            http_port=self.http_port,
            smtp_port=self.sink.port,
            peer_urls=urls,
        )
        config["server"].update(self.store)
        config = apply_patch(config, dict(self.flow.config))
        path = write_config(self.dir, config, {**self.tokens, **self.store_secrets})
        http_url = f"http://127.0.0.1:{self.http_port}"
        self.vars.values.update(
            {
                "http_url": http_url,
                "messages_url": http_url + MESSAGES_PATH,
                "domain": DOMAIN,
                **{f"peer.{p}.url": u for p, u in urls.items()},
                **{f"peer.{p}.token": self.tokens[p] for p in PEERS},
                **{f"peer.{p}.port": urlsplit(u).port for p, u in urls.items()},
            }
        )
        self.client = MasdClient(http_url)
        argv = [*self.argv, "--config", str(path)]
        if self.flow.clock == "test":
            argv.append("--test-clock")
        self.process = ChildProcess(argv, log=self.dir / "target.log", cwd=self.dir, env=self.env)
        await self.start_target()

    async def start_target(self) -> None:
        """Start the target; StepFailure when it exits or is not ready in time."""
        assert self.process is not None
        self.process.spawn()
        if not await poll(self._ready, within=READY_TIMEOUT):
            raise StepFailure(f"GET /healthz did not answer 200 within {READY_TIMEOUT:g} s")

    async def _ready(self) -> bool:
        assert self.process is not None
        assert self.client is not None
        code = self.process.exit_code()
        if code is not None:
            raise StepFailure(
                f"the target exited with {code} before it was ready: "
                + _one_line(self.process.tail(5))
            )
        return await self.client.healthy() and await listening(self.lmtp_port)

    async def stop_target(self, *, kill: bool = False) -> int:
        """SIGTERM (or SIGKILL) the target; its exit code."""
        assert self.process is not None
        try:
            return await self.process.stop(kill=kill)
        except ProcessStuck as exc:
            raise StepFailure(str(exc)) from None

    async def teardown(self) -> int | None:
        """Answer whatever is still held, stop the target (SIGTERM); its exit code."""
        self._release_all()
        code: int | None = None
        if self.process is not None and self.process.running:
            try:
                code = await self.stop_target()
            except StepFailure:
                code = -1
        self._release_all()  # anything that arrived while the target stopped
        if self.client is not None:
            await self.client.aclose()
        for peer in self.peers.values():
            await peer.close()
        await self.sink.close()
        return code

    def _release_all(self) -> None:
        for a in self.arrivals:
            if not a.reply.done():
                a.reply.set_result((503, _UNAVAILABLE))

    # -- shared by the steps --------------------------------------------------------

    @property
    def http(self) -> MasdClient:
        assert self.client is not None
        return self.client

    def leftovers(self) -> str:
        """What arrived and no step claimed: contract messages, then mail."""
        items = [a.describe() for a in self.arrivals if not a.claimed]
        items += [
            "mail to " + ", ".join(m.rcpt_tos)
            for i, m in enumerate(self.sink.messages)
            if i not in self.claimed_mail
        ]
        return ", ".join(items)

    async def clock(self, seconds: float) -> float:
        """Advance the test clock by ``seconds``; the target's time after it."""
        response = await self.http.advance_clock(seconds, self.tokens["admin"])
        where = "POST /mas/v0.1/test/clock"
        if response.status_code != 200:
            raise StepFailure(f"{where}: HTTP {response.status_code} {response.text}")
        try:
            return float(response.json()["now"])
        except (ValueError, KeyError, TypeError):
            raise StepFailure(f"{where}: no now in {response.text!r}") from None

    def capture(self, capture: Mapping[str, str], value: Any) -> None:
        """Set each variable of ``capture`` to its path in ``value``."""
        for name, path in capture.items():
            try:
                self.vars.values[name] = get_path(value, path)
            except MatchError as exc:
                raise StepFailure(f"capture {name}: {exc}") from None


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-400:]
