"""Play flows against an implementation running as a separate process.

For each flow: start the fake peers and the SMTP relay sink on loopback,
write the standard configuration (patched by the flow's ``config``), start
the target (``<python> -m masd serve`` by default) with ``--config FILE``
(and ``--test-clock`` for a test-clock flow), wait until ``GET /healthz``
answers 200, play the steps over real sockets, then stop the target with
SIGTERM (it must exit 0).  One fresh process and store per flow.

Contract messages the target sends are *held* by the fake peer until an
``expect`` step claims them and gives the peer's answer, so a flow decides
every answer (200, 4xx, 5xx, or hold until a ``release``).  The run is
strict: a contract message or a mail that no step claimed is a failure.

Output: one line per flow, ``PASS name`` or ``FAIL name: step N (kind):
what differed``, and last ``N passed, M failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import email.utils
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Final, TextIO
from urllib.parse import quote, urlsplit

import httpx

from masd import lmtpclient
from masd.conformance.flow import (
    PEERS,
    ExpectMailStep,
    ExpectStep,
    Flow,
    MailStep,
    NothingStep,
    PostStep,
    ReadStep,
    RelayStep,
    ReleaseStep,
    RestartStep,
    Step,
    TickStep,
)
from masd.conformance.match import MatchError, get_path, match, substitute
from masd.core.errors import MasdError
from masd.testing.peers import FakePeer, ReceivedMail, Recorded, SmtpSink

__all__ = ["DOMAIN", "FlowResult", "Target", "run", "run_flow", "run_flows", "standard_config"]

DOMAIN: Final = "help.example"
AUTHSERV_ID: Final = "mx.help.example"
MESSAGES_PATH: Final = "/mas/v0.1/messages"
CLOCK_PATH: Final = "/mas/v0.1/test/clock"
#: Bounds (real seconds) of starting and stopping the target.
READY_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 20.0
#: A held request not answered by then is answered 503 (the flow has long failed).
HOLD_LIMIT: Final = 60.0
#: After the last step, how long stray messages may still arrive and be caught.
SETTLE: Final = 0.2
POLL: Final = 0.02
#: While an expect step with ``advance`` waits, the clock moves this often (real seconds).
ADVANCE_EVERY: Final = 0.1
#: Types whose envelope has no ``case`` (CONTRACT §2).
_NO_CASE: Final = frozenset({"case.intake", "case.assign"})
_UNFOLD = re.compile(r"\r?\n[ \t]+")


class StepFailure(MasdError):
    """What differed at one step (the flow fails there)."""

    code = "step-failed"


@dataclass(frozen=True)
class Target:
    """The command line of the implementation under test (``--config FILE`` is appended).

    ``default`` marks masd itself, run from this interpreter: its package
    directory goes first on the child's ``PYTHONPATH``.
    """

    argv: tuple[str, ...]
    default: bool = False

    @classmethod
    def masd(cls) -> Target:
        return cls((sys.executable, "-m", "masd", "serve"), default=True)

    @classmethod
    def parse(cls, command: str | None) -> Target:
        if not command:
            return cls.masd()
        argv = tuple(shlex.split(command))
        if not argv:
            raise ValueError("--target: an empty command")
        return cls(argv)


@dataclass(frozen=True)
class FlowResult:
    name: str
    ok: bool
    detail: str = ""
    log: Path | None = None

    def line(self) -> str:
        return f"PASS {self.name}" if self.ok else f"FAIL {self.name}: {self.detail}"


# --------------------------------------------------------------------------- configuration


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def standard_config(
    *, lmtp_port: int, http_port: int, smtp_port: int, peer_urls: dict[str, str]
) -> dict[str, Any]:
    """The configuration every flow starts from (PROFILE §10 keys), as a TOML-shaped dict.

    Master type ``ticket`` (modes callback, chat, sms; callback and sms have
    endpoints, chat is listed without one); slave type ``case`` owned by the
    ``master`` peer with a ``webhook``; slave type ``order`` owned by the
    ``other`` master.  Secrets are in ``secrets/<peer>.token``.
    """
    return {
        "server": {
            "lmtp": f"127.0.0.1:{lmtp_port}",
            "http": f"127.0.0.1:{http_port}",
            "database": "masd.db",
            "smtp_relay": f"127.0.0.1:{smtp_port}",
            "trusted_authserv_ids": [AUTHSERV_ID],
            "admin_token_file": "secrets/admin.token",
            "retry_for": "1h",
        },
        "domains": {
            DOMAIN: {
                "types": {
                    "ticket": {
                        "role": "master",
                        "modes": ["callback", "chat", "sms"],
                        "endpoints": {
                            "callback": {
                                "url": peer_urls["callback"],
                                "token_file": "secrets/callback.token",
                                "deadline": "1h",
                                "fields": ["phone", "time"],
                            },
                            "sms": {
                                "url": peer_urls["sms"],
                                "token_file": "secrets/sms.token",
                                "deadline": "1h",
                                "fields": ["phone"],
                            },
                        },
                    },
                    "case": {
                        "role": "slave",
                        "master": {
                            "url": peer_urls["master"],
                            "token_file": "secrets/master.token",
                        },
                        "policy": {"autonomous_send": False, "transfers": "block"},
                        "webhooks": [
                            {
                                "url": peer_urls["webhook"],
                                "token_file": "secrets/webhook.token",
                                "fields": ["phone"],
                            }
                        ],
                    },
                    "order": {
                        "role": "slave",
                        "master": {"url": peer_urls["other"], "token_file": "secrets/other.token"},
                    },
                }
            }
        },
    }


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` merged into a copy of ``base``: objects merge, null deletes, the rest replaces."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_patch(config: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A flow's ``config``: ``server`` patches [server], ``types`` the types of help.example."""
    out = copy.deepcopy(config)
    if "server" in patch:
        out["server"] = merge(out["server"], patch["server"])
    if "types" in patch:
        domain = out["domains"][DOMAIN]
        domain["types"] = merge(domain["types"], patch["types"])
    return out


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def _is_table(value: Any) -> bool:
    """A dict (a table) or a non-empty list of dicts (an array of tables)."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    """A TOML document for a dict of dicts, strings, numbers, booleans and lists."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in doc.items():
        name = f"{prefix}.{_toml_key(key)}" if prefix else _toml_key(key)
        if _is_table(value):
            tables.append((name, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for name, value in tables:
        if isinstance(value, list):
            for item in value:
                text += f"\n[[{name}]]\n" + to_toml(item, name)
        else:
            body = to_toml(value, name)
            has_scalars = any(not _is_table(v) for v in value.values())
            text += (f"\n[{name}]\n" if has_scalars or not value else "") + body
    return text


def _write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")


# --------------------------------------------------------------------------- the target process


#: Every target process started and not yet reaped, so an interrupted run leaves none behind.
_LIVE: set[subprocess.Popen[bytes]] = set()


class Process:
    """The target as a child process: its log in a file, started and stopped bounded."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"==== {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
            )
        _LIVE.add(self.proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    async def stop(self, *, kill: bool = False) -> int:
        """SIGTERM (or SIGKILL) and wait; the exit code (SIGKILL after STOP_TIMEOUT)."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        until = time.monotonic() + STOP_TIMEOUT
        while proc.poll() is None:
            if time.monotonic() > until:
                proc.kill()
                proc.wait()
                _LIVE.discard(proc)
                raise StepFailure(f"the target did not exit within {STOP_TIMEOUT:g} s of SIGTERM")
            await asyncio.sleep(POLL)
        _LIVE.discard(proc)
        return proc.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- what arrives


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


# --------------------------------------------------------------------------- one flow


class FlowRun:
    """One flow against one fresh target process."""

    def __init__(self, flow: Flow, target: Target, workdir: Path) -> None:
        self.flow = flow
        self.target = target
        self.dir = workdir
        self.vars = Variables()
        self.arrivals: list[Arrival] = []
        self.claimed_mail: set[int] = set()
        self.saved: dict[str, tuple[str, tuple[str, ...], bytes]] = {}
        self.tokens: dict[str, str] = {}
        self.peers: dict[str, FakePeer] = {}
        self.sink = SmtpSink()
        self.process: Process | None = None
        self.http: httpx.AsyncClient | None = None
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
        self.lmtp_port = _free_port()
        self.http_port = _free_port()
        while self.http_port == self.lmtp_port:
            self.http_port = _free_port()
        urls = {
            "callback": self.peers["callback"].url + "mas",
            "sms": self.peers["sms"].url + "mas",
            "master": self.peers["master"].url + "mas",
            "other": self.peers["other"].url + "mas",
            "webhook": self.peers["webhook"].url + "hook/",
        }
        for name in (*PEERS, "admin"):
            self.tokens[name] = f"{name}-{secrets.token_hex(16)}"
            _write_secret(self.dir / "secrets" / f"{name}.token", self.tokens[name])
        config = standard_config(
            lmtp_port=self.lmtp_port,
            http_port=self.http_port,
            smtp_port=self.sink.port,
            peer_urls=urls,
        )
        config = apply_patch(config, dict(self.flow.config))
        (self.dir / "masd.toml").write_text(to_toml(config), encoding="utf-8")
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
        self.http = httpx.AsyncClient(base_url=http_url, timeout=10.0, trust_env=False)
        argv = [*self.target.argv, "--config", str(self.dir / "masd.toml")]
        if self.flow.clock == "test":
            argv.append("--test-clock")
        self.process = Process(argv, self._env(), self.dir, self.dir / "target.log")
        await self.start_target()

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
        }
        env["PYTHONUNBUFFERED"] = "1"
        if self.target.default:
            here = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        return env

    async def start_target(self) -> None:
        assert self.process is not None
        assert self.http is not None
        self.process.start()
        until = time.monotonic() + READY_TIMEOUT
        while True:
            code = self.process.exit_code()
            if code is not None:
                raise StepFailure(
                    f"the target exited with {code} before it was ready: "
                    + _one_line(self.process.tail(5))
                )
            with contextlib.suppress(httpx.HTTPError):
                response = await self.http.get("/healthz")
                if response.status_code == 200 and await self._lmtp_open():
                    return
            if time.monotonic() > until:
                raise StepFailure(f"GET /healthz did not answer 200 within {READY_TIMEOUT:g} s")
            await asyncio.sleep(0.05)

    async def _lmtp_open(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.lmtp_port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def teardown(self) -> int | None:
        """Answer whatever is still held, stop the target (SIGTERM); its exit code."""
        self._release_all()
        code: int | None = None
        if self.process is not None and self.process.running:
            try:
                code = await self.process.stop()
            except StepFailure:
                code = -1
        self._release_all()  # anything that arrived while the target stopped
        if self.http is not None:
            await self.http.aclose()
        for peer in self.peers.values():
            await peer.close()
        await self.sink.close()
        return code

    def _release_all(self) -> None:
        for a in self.arrivals:
            if not a.reply.done():
                a.reply.set_result((503, {"ok": False, "error": "unavailable", "detail": "end"}))

    # -- the steps ------------------------------------------------------------------

    async def play(self) -> None:
        for i, step in enumerate(self.flow.steps, start=1):
            try:
                await self.do(step)
            except StepFailure as exc:
                raise StepFailure(f"step {i} ({step.kind}): {exc.detail}") from None
            except (lmtpclient.LmtpError, httpx.HTTPError, OSError, MatchError) as exc:
                raise StepFailure(f"step {i} ({step.kind}): {type(exc).__name__}: {exc}") from None
        await asyncio.sleep(SETTLE)
        left = self.leftovers()
        if left:
            raise StepFailure(f"after the last step: unexpected {left}")

    async def do(self, step: Step) -> None:
        a = step.action
        if isinstance(a, MailStep):
            await self.mail(a)
        elif isinstance(a, PostStep):
            await self.post(a)
        elif isinstance(a, ExpectStep):
            await self.expect(a)
        elif isinstance(a, ReleaseStep):
            self.release(a)
        elif isinstance(a, ExpectMailStep):
            await self.expect_mail(a)
        elif isinstance(a, NothingStep):
            await self.nothing(a)
        elif isinstance(a, TickStep):
            await self.clock(a.seconds)
        elif isinstance(a, RestartStep):
            await self.restart(a)
        elif isinstance(a, ReadStep):
            await self.read(a)
        else:
            await self.relay(a)

    # mail in

    async def mail(self, step: MailStep) -> None:
        if step.again is not None:
            mail_from, rcpt, raw = self.saved[step.again]
            rcpt = tuple(self.vars.fill(list(step.rcpt))) or rcpt
        else:
            mail_from, raw, message_id = build_mail(step, self.vars.fill)
            rcpt = tuple(self.vars.fill(list(step.rcpt)))
            if step.save_as:
                self.vars.values[f"{step.save_as}.message_id"] = message_id
        if step.save_as:
            self.saved[step.save_as] = (mail_from, rcpt, raw)
        result = await lmtpclient.deliver(
            ("127.0.0.1", self.lmtp_port), mail_from, list(rcpt), raw, timeout=30.0
        )
        wanted = step.replies or tuple("250" for _ in rcpt)
        if len(wanted) != len(rcpt):
            raise StepFailure(f"{len(wanted)} replies expected for {len(rcpt)} recipients")
        for address, want, got in zip(rcpt, wanted, result.recipients, strict=True):
            text = str(got.final)
            if not (text == want or text.startswith(want + " ")):
                raise StepFailure(f"recipient {address}: expected reply {want}, got {text!r}")

    # contract messages in

    async def post(self, step: PostStep) -> None:
        assert self.http is not None
        headers: dict[str, str] = {"Content-Type": "application/json"}
        if step.peer not in ("nobody",):
            headers["Authorization"] = f"Bearer {self.tokens[step.peer]}"
        for name, value in step.headers:
            for existing in [h for h in headers if h.lower() == name.lower()]:
                del headers[existing]
            if value is not None:
                headers[name] = str(self.vars.fill(value))
        if step.raw is not None:
            body = (str(self.vars.fill(step.raw)) * step.repeat).encode("utf-8")
        else:
            message = self.vars.fill(step.message)
            if step.envelope:
                message = {"mas_modes_version": "0.1", "id": secrets.token_hex(16), **message}
            body = json.dumps(message).encode("utf-8")
        response = await self.http.post(step.path, content=body, headers=headers)
        try:
            got: Any = response.json()
        except ValueError:
            got = response.text
        if response.status_code != step.status:
            raise StepFailure(
                f"expected HTTP {step.status}, got {response.status_code} {_short(got)}"
            )
        if step.body is not None:
            diff = match(self.vars.fill(step.body), got, "body")
            if diff is not None:
                raise StepFailure(diff)
        self._capture(step.capture, got)

    def _capture(self, capture: Mapping[str, str], value: Any) -> None:
        for name, path in capture.items():
            try:
                self.vars.values[name] = get_path(value, path)
            except MatchError as exc:
                raise StepFailure(f"capture {name}: {exc}") from None

    # contract messages out

    async def expect(self, step: ExpectStep) -> None:
        fields = self.vars.fill(dict(step.fields))
        path = None if step.path is None else str(self.vars.fill(step.path))
        until = time.monotonic() + step.within
        waiting = _Advance(self, step.advance)
        while True:
            found, closest = self._find(step.peer, step.type, fields, path)
            if found is not None:
                break
            if time.monotonic() > until:
                raise StepFailure(self._missing(step, closest))
            await waiting.pause()
        found.claimed = True
        self._check_contract(found)
        self._capture(step.capture, found.rec.json)
        if step.answer is None:
            found.held = True
        else:
            found.reply.set_result((step.answer.status, self.vars.fill(step.answer.body)))

    def _find(
        self, peer: str, mtype: str, fields: Any, path: str | None = None
    ) -> tuple[Arrival | None, str | None]:
        closest: str | None = None
        for a in self.arrivals:
            body = a.rec.json
            if a.claimed or a.peer != peer or not isinstance(body, dict):
                continue
            if body.get("type") != mtype:
                continue
            diff = match(fields, body, "")
            if diff is None and path is not None and a.rec.path != path:
                diff = f"path: expected {path}, got {a.rec.path}"
            if diff is None:
                return a, None
            closest = closest or diff
        return None, closest

    def _missing(self, step: ExpectStep, closest: str | None) -> str:
        what = f"no {step.type} to {step.peer} within {step.within:g} s"
        if closest is not None:
            return f"{what}; the nearest differs: {closest}"
        others = [a.describe() for a in self.arrivals if not a.claimed]
        return f"{what}" + (f" (unclaimed: {', '.join(others)})" if others else "")

    def _check_contract(self, a: Arrival) -> None:
        """What every contract message must be (CONTRACT §2, PROFILE §6, §7)."""
        rec, body = a.rec, a.rec.json
        problems = []
        if rec.method != "POST":
            problems.append(f"method {rec.method}, not POST")
        if not rec.headers.get("content-type", "").startswith("application/json"):
            problems.append(f"Content-Type {rec.headers.get('content-type')!r}")
        if rec.headers.get("authorization") != f"Bearer {self.tokens[a.peer]}":
            problems.append("Authorization is not Bearer <the peer's secret>")
        if body.get("mas_modes_version") != "0.1":
            problems.append(f"mas_modes_version {body.get('mas_modes_version')!r}")
        if not isinstance(body.get("id"), str) or not body.get("id"):
            problems.append("no id")
        case = body.get("case")
        if body.get("type") not in _NO_CASE and not (
            isinstance(case, dict) and isinstance(case.get("address"), str) and "key" in case
        ):
            problems.append("no case {address, key}")
        if problems:
            raise StepFailure(f"{a.describe()}: " + "; ".join(problems))

    def release(self, step: ReleaseStep) -> None:
        held = [a for a in self.arrivals if a.peer == step.peer and a.held and not a.reply.done()]
        if not held:
            raise StepFailure(f"no held request to {step.peer} to release")
        held[0].reply.set_result((step.answer.status, self.vars.fill(step.answer.body)))

    # mail out

    async def expect_mail(self, step: ExpectMailStep) -> None:
        until = time.monotonic() + step.within
        waiting = _Advance(self, step.advance)
        while True:
            found, closest = self._find_mail(step)
            if found is not None:
                break
            if time.monotonic() > until:
                what = f"no mail{' to ' + step.to if step.to else ''} within {step.within:g} s"
                raise StepFailure(f"{what}; the nearest differs: {closest}" if closest else what)
            await waiting.pause()
        index, mail = found
        self.claimed_mail.add(index)
        _check_mail(mail)
        message = mail.message
        for name, header in step.capture.items():
            value = message.get(header)
            if value is None:
                raise StepFailure(f"capture {name}: the mail has no {header} header")
            self.vars.values[name] = _unfold(str(value))

    def _find_mail(
        self, step: ExpectMailStep
    ) -> tuple[tuple[int, ReceivedMail] | None, str | None]:
        closest: str | None = None
        to = self.vars.fill(step.to) if step.to else None
        for i, mail in enumerate(self.sink.messages):
            if i in self.claimed_mail:
                continue
            if to is not None and [r.lower() for r in mail.rcpt_tos] != [to.lower()]:
                continue
            diff = self._mail_diff(step, mail)
            if diff is None:
                return (i, mail), None
            closest = closest or diff
        return None, closest

    def _mail_diff(self, step: ExpectMailStep, mail: ReceivedMail) -> str | None:
        message = mail.message
        if step.sender is not None:
            got = email.utils.parseaddr(str(message.get("From", "")))[1]
            want = str(self.vars.fill(step.sender))
            if got.lower() != want.lower():
                return f"From: expected {want}, got {got or '(none)'}"
        for name, want in step.headers.items():
            value = message.get(name)
            if value is None:
                return f"{name}: missing"
            diff = match(self.vars.fill(want), _unfold(str(value)), name)
            if diff is not None:
                return diff
        for name in step.absent_headers:
            if name in message:
                return f"{name}: expected no such header, got {_unfold(str(message[name]))!r}"
        text = _text_of(message)
        for piece in self.vars.fill(list(step.body_contains)):
            if piece not in text:
                return f"body: no {piece!r} in {_short(text)}"
        lines = [line.rstrip("\r") for line in text.splitlines()]
        for line in self.vars.fill(list(step.body_lines)):
            if line not in lines:
                return f"body: no line {line!r} in {_short(text)}"
        for piece in self.vars.fill(list(step.body_lacks)):
            if piece in text:
                return f"body: {piece!r} should not be there: {_short(text)}"
        return None

    # time, quiet, restart

    def leftovers(self) -> str:
        items = [a.describe() for a in self.arrivals if not a.claimed]
        items += [
            "mail to " + ", ".join(m.rcpt_tos)
            for i, m in enumerate(self.sink.messages)
            if i not in self.claimed_mail
        ]
        return ", ".join(items)

    async def nothing(self, step: NothingStep) -> None:
        left = self.leftovers()
        if not left:
            await asyncio.sleep(step.within)
            left = self.leftovers()
        if left:
            raise StepFailure(f"expected nothing, got {left}")

    async def clock(self, seconds: float) -> float:
        """Advance the test clock by ``seconds``; the target's time after it."""
        assert self.http is not None
        response = await self.http.post(
            CLOCK_PATH,
            json={"advance": seconds},
            headers={"Authorization": f"Bearer {self.tokens['admin']}"},
        )
        if response.status_code != 200:
            raise StepFailure(f"POST {CLOCK_PATH}: HTTP {response.status_code} {response.text}")
        try:
            return float(response.json()["now"])
        except (ValueError, KeyError, TypeError):
            raise StepFailure(f"POST {CLOCK_PATH}: no now in {response.text!r}") from None

    async def restart(self, step: RestartStep) -> None:
        assert self.process is not None
        left = self.leftovers()
        if left:
            raise StepFailure(f"unexpected before the restart: {left}")
        if any(a.held and not a.reply.done() for a in self.arrivals):
            raise StepFailure("a held request was not released before the restart")
        before = await self.clock(0) if self.flow.clock == "test" else 0.0
        code = await self.process.stop(kill=step.kill)
        if not step.kill and code != 0:
            raise StepFailure(f"the target exited with {code} on SIGTERM, not 0")
        await self.start_target()
        if self.flow.clock == "test":
            # One flow, one timeline: the new process's clock resumes where the old one was.
            after = await self.clock(0)
            if before > after:
                await self.clock(before - after)

    async def relay(self, step: RelayStep) -> None:
        if step.refuse is not None:
            self.sink.refuse(step.refuse, step.count, at=step.at)
        else:
            await self.sink.set_down(bool(step.down))

    # the read side

    async def read(self, step: ReadStep) -> None:
        key = str(self.vars.fill(step.case))
        until = time.monotonic() + step.within
        while True:
            diff = await self._read_once(step, key)
            if diff is None:
                return
            if time.monotonic() > until:
                raise StepFailure(diff)
            await asyncio.sleep(0.05)

    async def _read_once(self, step: ReadStep, key: str) -> str | None:
        assert self.http is not None
        path = f"/mas/v0.1/cases/{quote(key, safe='')}"
        auth = {"Authorization": f"Bearer {self.tokens['admin']}"}
        if not step.thread:
            response = await self.http.get(path, headers=auth)
            if response.status_code != step.status:
                return f"GET case {key}: expected HTTP {step.status}, got {response.status_code}"
            if step.match is None:
                return None
            return match(self.vars.fill(step.match), response.json(), "")
        entries: list[Any] = []
        after = 0
        while True:
            response = await self.http.get(
                path + "/thread", params={"after": after, "limit": 1000}, headers=auth
            )
            if response.status_code != step.status:
                return f"GET thread {key}: expected HTTP {step.status}, got {response.status_code}"
            if response.status_code != 200:
                return None
            page = response.json()
            entries += page.get("entries", [])
            if not page.get("entries"):
                break
            after = page["next"]
        if step.kinds is not None:
            kinds = [e.get("kind") for e in entries]
            if kinds != list(step.kinds):
                return f"thread kinds: expected {list(step.kinds)}, got {kinds}"
        if step.entries is not None:
            return _in_order(self.vars.fill(list(step.entries)), entries)
        return None


class _Advance:
    """A wait that moves the test clock by ``seconds`` every :data:`ADVANCE_EVERY`.

    For what happens "after some time" without the flow knowing exactly when
    the target scheduled it (a retry's backoff is set when the failure is
    recorded, which the flow cannot see).
    """

    def __init__(self, run: FlowRun, seconds: float | None) -> None:
        self.run = run
        self.seconds = seconds
        self.next = time.monotonic() + ADVANCE_EVERY

    async def pause(self) -> None:
        await asyncio.sleep(POLL)
        if self.seconds and time.monotonic() >= self.next:
            await self.run.clock(self.seconds)
            self.next = time.monotonic() + ADVANCE_EVERY


def _in_order(expected: list[Any], entries: list[Any]) -> str | None:
    """Each expected entry matches a thread entry after the previous one's."""
    at = 0
    for n, want in enumerate(expected):
        start = at
        while at < len(entries) and match(want, entries[at]) is not None:
            at += 1
        if at == len(entries):
            kind = want.get("kind") if isinstance(want, dict) else None
            near = [e for e in entries[start:] if kind is None or e.get("kind") == kind]
            why = f"; the nearest differs: {match(want, near[0])}" if near else ""
            return f"thread: no entry from index {start} on matches entries[{n}]{why}"
        at += 1
    return None


def _check_mail(mail: ReceivedMail) -> None:
    """What every mail must be (PROFILE §4): To the envelope recipient, a Message-ID
    under the domain of its From."""
    message = mail.message
    to = email.utils.parseaddr(str(message.get("To", "")))[1]
    if [to.lower()] != [r.lower() for r in mail.rcpt_tos]:
        raise StepFailure(f"mail: To {to!r} is not the envelope recipient {list(mail.rcpt_tos)}")
    sender = email.utils.parseaddr(str(message.get("From", "")))[1]
    mid = str(message.get("Message-ID", ""))
    domain = sender.rpartition("@")[2].lower()
    if not (mid.startswith("<") and mid.lower().endswith(f"@{domain}>")):
        raise StepFailure(f"mail: Message-ID {mid!r} is not under the From domain {domain!r}")


def _text_of(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    if part is None:
        return ""
    try:
        return str(part.get_content())
    except (LookupError, ValueError):
        return ""


def _unfold(value: str) -> str:
    return _UNFOLD.sub(" ", value).strip()


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return repr(text) if len(text) <= 160 else repr(text[:160] + "…")


def _first(text: str, limit: int = 600) -> str:
    """One line, at most ``limit`` characters, keeping the start (the step and the field)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "…"


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-400:]


# --------------------------------------------------------------------------- building mail


def build_mail(step: MailStep, fill: Callable[[Any], Any]) -> tuple[str, bytes, str]:
    """The raw message a ``mail`` step delivers: (envelope sender, bytes, Message-ID).

    Our MX's trace on top (unless ``trace`` replaces it): the
    Authentication-Results line of ``auth`` and a ``Received`` by the MX.
    Header values are written as given, so a flow can hand over anything.
    """
    sender = str(fill(step.sender))
    addresses = email.utils.getaddresses([sender])
    first = addresses[0][1] if addresses else ""
    domain = first.rpartition("@")[2] or "example.org"
    mail_from = first if step.mail_from is None else str(fill(step.mail_from))
    date = email.utils.formatdate(usegmt=True)
    message_id = (
        ""
        if step.no_message_id
        else str(fill(step.message_id or "")) or (f"<{secrets.token_hex(8)}@{domain}>")
    )
    trace: list[tuple[str, str]] = []
    if step.trace is not None:
        trace = [(n, str(fill(v))) for n, v in step.trace]
    else:
        if step.auth is not None:
            header_from = step.auth.header_from or domain
            trace.append(
                (
                    "Authentication-Results",
                    f"{step.auth.authserv_id}; dmarc={step.auth.dmarc} header.from={header_from}",
                )
            )
        trace.append(("Received", f"from mail.{domain} by {AUTHSERV_ID} with ESMTPS; {date}"))
    rcpt = [str(r) for r in fill(list(step.rcpt))]
    defaults: list[tuple[str, str]] = [("From", sender), ("To", str(fill(step.to_header or "")))]
    if not step.to_header:
        defaults[1] = ("To", rcpt[0] if rcpt else f"ticket@{DOMAIN}")
    if step.subject is not None:
        defaults.append(("Subject", str(fill(step.subject))))
    defaults.append(("Date", date))
    if message_id:
        defaults.append(("Message-ID", message_id))
    if step.in_reply_to:
        parent = str(fill(step.in_reply_to))
        defaults += [("In-Reply-To", parent), ("References", parent)]
    body = str(fill(step.body)) * step.body_repeat
    defaults += [
        ("MIME-Version", "1.0"),
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Transfer-Encoding", "7bit" if body.isascii() else "8bit"),
    ]
    extra = [(n, str(fill(v))) for n, v in step.headers]
    given = {n.lower() for n, _ in extra}
    headers = trace + [(n, v) for n, v in defaults if n.lower() not in given] + extra
    text = "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n" + body
    raw = re.sub(r"\r?\n", "\r\n", text).encode("utf-8")
    return mail_from, raw, message_id


# --------------------------------------------------------------------------- running flows


async def run_flow(flow: Flow, target: Target, workdir: Path) -> FlowResult:
    """One flow, one fresh target; never raises for what the target does."""
    run = FlowRun(flow, target, workdir)
    log = workdir / "target.log"
    failure: str | None = None
    try:
        await run.setup()
        await run.play()
    except StepFailure as exc:
        failure = exc.detail
    except (lmtpclient.LmtpError, httpx.HTTPError, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        code = await run.teardown()
    if failure is None and code not in (0, None):
        failure = f"after the last step: the target exited with {code} on SIGTERM, not 0"
    if failure is not None:
        return FlowResult(flow.name, False, _first(failure), log)
    return FlowResult(flow.name, True, log=log)


async def run_flows(
    flows: Sequence[Flow],
    target: Target,
    out: TextIO,
    *,
    keep: Path | None = None,
    verbose: bool = False,
) -> list[FlowResult]:
    """Every flow in turn; prints one line each and the summary line."""
    results: list[FlowResult] = []
    base = Path(tempfile.mkdtemp(prefix="masd-conf-")) if keep is None else keep
    base.mkdir(parents=True, exist_ok=True)
    try:
        for flow in flows:
            workdir = base / f"{flow.role}-{flow.name}"
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            result = await run_flow(flow, target, workdir)
            results.append(result)
            print(result.line(), file=out, flush=True)
            if verbose and not result.ok and result.log is not None:
                tail = Process([], {}, workdir, result.log).tail(40)
                print("    " + tail.replace("\n", "\n    "), file=out, flush=True)
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)
    passed = sum(r.ok for r in results)
    print(f"{passed} passed, {len(results) - passed} failed", file=out, flush=True)
    return results


def run(
    flows: Sequence[Flow],
    target: Target,
    out: TextIO,
    *,
    keep: Path | None = None,
    verbose: bool = False,
) -> int:
    """Run the flows; exit status 0 only when every one passes."""
    try:
        results = asyncio.run(run_flows(flows, target, out, keep=keep, verbose=verbose))
    finally:
        for proc in list(_LIVE):  # interrupted: no target outlives the run
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT)
            _LIVE.discard(proc)
    return 0 if results and all(r.ok for r in results) else 1


def command(
    *,
    role: str | None,
    names: Sequence[str],
    target: str | None,
    flows_dir: Path | None,
    keep: Path | None,
    verbose: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """``masd conformance run``: 0 all passed, 1 a flow failed, 2 nothing to run or a bad flow."""
    from masd._resources import conformance_dir
    from masd.conformance.flow import FlowError, load_flows

    folder = flows_dir or conformance_dir() / "flows"
    try:
        flows = load_flows(folder, role)
        chosen = Target.parse(target)
    except FlowError as exc:
        print(f"masd: {exc}", file=err)
        return 2
    except ValueError as exc:
        print(f"masd: {exc}", file=err)
        return 2
    if names:
        known = {f.name for f in flows}
        unknown = [n for n in names if n not in known]
        if unknown:
            print(f"masd: no flow {unknown[0]!r} in {folder}", file=err)
            return 2
        flows = [f for f in flows if f.name in names]
    if not flows:
        print(f"masd: no flows under {folder}" + (f"/{role}" if role else ""), file=err)
        return 2
    return run(flows, chosen, out, keep=keep, verbose=verbose)
