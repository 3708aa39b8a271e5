"""``masd demo``: masd in the master role, on loopback, with a mode endpoint and a mail sink.

Everything runs in one process and one event loop: masd itself (:class:`masd.app.App`
with an embedded configuration written to a temporary directory), a demo
callback endpoint that speaks the mode contract, and an SMTP sink standing in
for the outbound relay.  The demo delivers a handful of mails over LMTP, the
way Postfix would, waits until every flow has settled and prints each case's
thread.

A second part runs masd in the slave role: a built-in demo master (a small
CRM) receives ``case.intake``, names the cases with ``case.assign``, answers
mail with ``mail.send`` and turns one case's transfers to a callback webhook,
whose statuses masd relays back to it in order.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import email.policy
import email.utils
import json
import os
import secrets
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from email.message import EmailMessage
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

from masd import lmtpclient
from masd.app import App
from masd.config import Config, load_config
from masd.readside import case_json, format_case, thread_json

DOMAIN = "help.example"
AUTHSERV_ID = "mx.help.example"
#: How long the demo waits for every flow to settle before it reports failure.
SETTLE_SECONDS = 20.0
#: Pause between the statuses the demo endpoint posts.
STEP_SECONDS = 0.2

CONFIG_TEMPLATE = """\
# masd demo configuration (written by `masd demo`; every path is relative to this file)
[server]
lmtp = "127.0.0.1:0"
http = "127.0.0.1:{http_port}"
database = "masd.db"
smtp_relay = "127.0.0.1:{smtp_port}"
trusted_authserv_ids = ["{authserv_id}"]
admin_token_file = "secrets/admin.token"

[domains."{domain}".types.ticket]
role = "master"
modes = ["callback", "chat"]   # chat is enabled but has no endpoint: mode-unavailable

[domains."{domain}".types.ticket.endpoints.callback]
url = "{endpoint_url}"
token_file = "secrets/callback.token"
deadline = "1h"
fields = ["phone", "time"]
"""

SLAVE_TEMPLATE = """
[domains."{domain}".types.case]   # the slave role: an outside master owns these cases
role = "slave"
master = {{ url = "{master_url}", token_file = "secrets/crm.token" }}
policy = {{ autonomous_send = false, transfers = "block" }}

[[domains."{domain}".types.case.webhooks]]   # where the master may turn transfers to
url = "{webhook_url}"
token_file = "secrets/transfer.token"
fields = ["phone"]
"""


# --------------------------------------------------------------------------- output


class Printer:
    """Writes the demo's lines: headings, explanations and events as they happen."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def heading(self, text: str) -> None:
        self.line()
        self.line(text)
        self.line("-" * len(text))

    def event(self, who: str, text: str) -> None:
        self.line(f"  {who:<9} | {text}")


# --------------------------------------------------------------------------- mail sink


@dataclass
class SentMail:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    @property
    def body(self) -> str:
        part = self.message.get_body(("plain",))
        return "" if part is None else str(part.get_content())


class MailSink:
    """The SMTP relay masd sends through: prints and keeps every mail it gets."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self.mails: list[SentMail] = []
        self.arrived = asyncio.Condition()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: SMTP(self, hostname="sink.demo", loop=loop), "127.0.0.1", 0
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode()
        message = message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        sent = SentMail(str(envelope.mail_from), list(envelope.rcpt_tos), message)
        auto = message.get("Auto-Submitted")
        self.printer.event(
            "mail out",
            f"From {message['From']}  To {message['To']}"
            + (f"  (Auto-Submitted: {auto})" if auto else ""),
        )
        self.printer.event("", f"Subject: {message['Subject']}")
        lines = [x for x in sent.body.strip().splitlines() if x.strip()][:4]
        for text in lines:
            self.printer.event("", f"  > {text}")
        async with self.arrived:
            self.mails.append(sent)
            self.arrived.notify_all()
        return "250 2.0.0 Ok: queued"

    def to(self, address: str) -> list[SentMail]:
        return [m for m in self.mails if address.lower() in (r.lower() for r in m.rcpt_tos)]

    async def wait_for(self, test: Callable[[], bool], until: float) -> bool:
        loop = asyncio.get_running_loop()
        async with self.arrived:
            while not test():
                left = until - loop.time()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), left)
            return True


# --------------------------------------------------------------------------- mode endpoint


@dataclass
class DemoHandoff:
    request: dict[str, Any]
    details: dict[str, str]
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0


class _DemoPeer(abc.ABC):
    """A demo peer: an aiohttp server on 127.0.0.1 (port 0) at ``path``, and a
    client for what it posts back to masd."""

    path = "/mas"

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    @abc.abstractmethod
    async def _handle(self, request: web.Request) -> web.Response:
        """Answer one POST from masd."""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post(self.path, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self._client = aiohttp.ClientSession()
        return f"http://127.0.0.1:{port}{self.path}"

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()


class DemoCallbackEndpoint(_DemoPeer):
    """A callback service speaking the mode contract: it "calls" the participant.

    It answers ``handoff.request`` at once, then posts ``handoff.status``
    back to the request's ``status_url``: ``scheduled``, ``running``,
    ``completed``.  A request without a ``phone`` first gets ``negotiating``
    with ``needs: ["phone"]``; the endpoint goes on once a
    ``handoff.update`` brings the phone number.
    """

    def __init__(self, token: str, printer: Printer) -> None:
        super().__init__()
        self.token = token
        self.printer = printer
        self.handoffs: dict[str, DemoHandoff] = {}

    async def _handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(
                {"ok": False, "error": "unauthenticated", "detail": "Authorization: wrong secret"},
                status=401,
            )
        try:
            message = await request.json()
        except ValueError:
            return web.json_response(
                {"ok": False, "error": "invalid-message", "detail": "body: not JSON"}, status=400
            )
        mtype = message.get("type")
        handoff_id = str(message.get("handoff_id"))
        case = (message.get("case") or {}).get("address")
        if mtype == "handoff.request":
            details = {str(k): str(v) for k, v in (message.get("details") or {}).items()}
            shown = ", ".join(f"{k}={v!r}" for k, v in details.items() if k != "subject")
            self.printer.event(
                "callback",
                f"got handoff.request for {case} (handoff {handoff_id[:8]}; "
                f"details: {shown or 'none besides the subject'})",
            )
            if handoff_id not in self.handoffs:
                started = DemoHandoff(message, details)
                self.handoffs[handoff_id] = started
                self._spawn(self._run(started))
            return web.json_response({"ok": True})
        handoff = self.handoffs.get(handoff_id)
        if handoff is None:
            return web.json_response(
                {"ok": False, "error": "unknown-handoff", "detail": f"handoff_id: {handoff_id}"},
                status=404,
            )
        if mtype == "handoff.update":
            new = {str(k): str(v) for k, v in (message.get("details") or {}).items()}
            self.printer.event(
                "callback",
                f"got handoff.update for {case}: "
                + ", ".join(f"{k}={v!r}" for k, v in new.items()),
            )
            handoff.details.update(new)
            handoff.updated.set()
        elif mtype == "handoff.cancel":
            self.printer.event(
                "callback", f"got handoff.cancel for {case} (reason {message.get('reason')})"
            )
        return web.json_response({"ok": True})

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, handoff: DemoHandoff) -> None:
        await asyncio.sleep(STEP_SECONDS)
        while "phone" not in handoff.details:
            handoff.updated.clear()
            await self._post(
                handoff,
                "negotiating",
                needs=["phone"],
                detail="Which number should we call?",
            )
            await handoff.updated.wait()
            await asyncio.sleep(STEP_SECONDS)
        at = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self._post(handoff, "scheduled", at=at)
        await asyncio.sleep(STEP_SECONDS)
        await self._post(handoff, "running")
        await asyncio.sleep(STEP_SECONDS)
        await self._post(
            handoff, "completed", detail=f"We called {handoff.details['phone']} and talked."
        )

    async def _post(self, handoff: DemoHandoff, status: str, **fields: Any) -> None:
        assert self._client is not None
        handoff.seq += 1
        request = handoff.request
        message = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": secrets.token_hex(16),
            "case": request["case"],
            "handoff_id": request["handoff_id"],
            "seq": handoff.seq,
            "status": status,
            **fields,
        }
        async with self._client.post(
            request["status_url"],
            json=message,
            headers={"Authorization": f"Bearer {self.token}"},
        ) as response:
            answer = await response.text()
        extra = f" needs {fields['needs']}" if "needs" in fields else ""
        self.printer.event(
            "callback",
            f"posted handoff.status {status} (seq {handoff.seq}){extra} -> HTTP {response.status}"
            + ("" if response.status == 200 else f" {answer}"),
        )


# --------------------------------------------------------------------------- inbound mail


def compose_mail(
    *,
    sender: str,
    name: str,
    to: str,
    subject: str,
    body: str,
    authenticated: bool = True,
    headers: dict[str, str] | None = None,
    in_reply_to: str | None = None,
) -> tuple[str, bytes]:
    """A mail as Postfix would hand it over: our MX's Received and A-R on top."""
    domain = sender.rsplit("@", 1)[1]
    message_id = email.utils.make_msgid(domain=domain)
    msg = EmailMessage(policy=email.policy.SMTP)
    if authenticated:
        msg["Authentication-Results"] = f"{AUTHSERV_ID}; dmarc=pass header.from={domain}"
    msg["Received"] = (
        f"from mail.{domain} (mail.{domain} [192.0.2.25]) by {AUTHSERV_ID} with ESMTPS; "
        + email.utils.formatdate(usegmt=True)
    )
    msg["From"] = email.utils.formataddr((name, sender))
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = message_id
    if in_reply_to:
        msg["In-Reply-To"] = in_reply_to
        msg["References"] = in_reply_to
    for key, value in (headers or {}).items():
        msg[key] = value
    msg.set_content(body)
    return message_id, msg.as_bytes()


# --------------------------------------------------------------------------- the demo


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_setup(
    directory: Path,
    *,
    http_port: int,
    smtp_port: int,
    endpoint_url: str,
    token: str,
    slave: SlavePeers | None = None,
) -> Path:
    """The demo's config file and its token files (mode 0600) in ``directory``.

    With ``slave``, type ``case`` is added in the slave role, owned by that master.
    """
    secrets_dir = directory / "secrets"
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    tokens = [("admin.token", secrets.token_hex(24)), ("callback.token", token)]
    if slave is not None:
        tokens += [("crm.token", slave.master_token), ("transfer.token", slave.webhook_token)]
    for name, value in tokens:
        path = secrets_dir / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(value + "\n")
    config = directory / "masd.toml"
    text = CONFIG_TEMPLATE.format(
        http_port=http_port,
        smtp_port=smtp_port,
        endpoint_url=endpoint_url,
        domain=DOMAIN,
        authserv_id=AUTHSERV_ID,
    )
    if slave is not None:
        text += SLAVE_TEMPLATE.format(
            domain=DOMAIN, master_url=slave.master_url, webhook_url=slave.webhook_url
        )
    config.write_text(text)
    return config


class Demo:
    """One run of the demo: the peers, masd, the mails and the waiting."""

    def __init__(self, out: TextIO, directory: Path) -> None:
        self.p = Printer(out)
        self.directory = directory
        self.sink = MailSink(self.p)
        self.token = secrets.token_hex(24)
        self.endpoint = DemoCallbackEndpoint(self.token, self.p)
        # The slave part's peers: an outside master and the service its transfers reach.
        self.crm = DemoMaster(secrets.token_hex(24), self.p)
        self.transfer = DemoCallbackEndpoint(secrets.token_hex(24), self.p)
        self.slave: SlavePeers | None = None
        self.app: App | None = None
        self.lmtp_port = 0
        self.problems: list[str] = []
        self.until = 0.0

    # ---- set-up

    async def start(self) -> None:
        smtp_port = await self.sink.start()
        endpoint_url = await self.endpoint.start()
        self.slave = SlavePeers(
            await self.crm.start(), self.crm.token, await self.transfer.start(), self.transfer.token
        )
        last_error: OSError | None = None
        for _ in range(3):  # the free HTTP port may be taken before masd binds it
            config_path = write_setup(
                self.directory,
                http_port=free_port(),
                smtp_port=smtp_port,
                endpoint_url=endpoint_url,
                token=self.token,
                slave=self.slave,
            )
            config = load_config(config_path)
            self.crm.masd_url = config.server.public_url.rstrip("/") + "/mas/v0.1/messages"
            app = App(config)
            try:
                listening = await app.start()
            except OSError as exc:
                last_error = exc
                await app.stop()
                continue
            self.app = app
            sockets: Sequence[socket.socket] = getattr(listening.lmtp, "sockets", None) or []
            self.lmtp_port = int(sockets[0].getsockname()[1])
            self._describe(config, config_path, smtp_port, endpoint_url)
            return
        raise RuntimeError(f"masd could not bind its HTTP listener: {last_error}")

    def _describe(self, config: Config, path: Path, smtp_port: int, endpoint_url: str) -> None:
        p = self.p
        http = config.server.http
        p.line("masd demo: email as the master of a case (MAS mode contract v0.1)")
        p.line("=" * 66)
        p.line("Everything runs on this machine, on 127.0.0.1 only:")
        p.line(f"  masd          LMTP 127.0.0.1:{self.lmtp_port} (where Postfix would deliver),")
        p.line(f"                HTTP {http} (mode endpoints post statuses here)")
        p.line(f"  callback      a demo mode endpoint at {endpoint_url}")
        p.line(f"  mail out      an SMTP sink at 127.0.0.1:{smtp_port}, standing in for the relay")
        p.line(f"  config        {path}")
        p.line(f"Domain {DOMAIN}, type 'ticket' in the master role; modes enabled:")
        p.line("  callback (endpoint above, fields phone and time, deadline 1h) and chat")
        p.line("  (enabled, but no endpoint is configured).")
        p.line(f"Mail counts as authenticated when our MX ({AUTHSERV_ID}) wrote dmarc=pass")
        p.line("for its From domain in Authentication-Results.")

    async def stop(self) -> None:
        if self.app is not None:
            await self.app.stop()
        await self.endpoint.stop()
        await self.crm.stop()
        await self.transfer.stop()
        await self.sink.stop()

    # ---- helpers

    async def deliver(self, rcpt: str, mail_from: str, data: bytes) -> bool:
        try:
            result = await lmtpclient.deliver(
                ("127.0.0.1", self.lmtp_port), mail_from, [rcpt], data
            )
        except lmtpclient.LmtpError as exc:
            self.p.event("LMTP", f"delivery to {rcpt} failed: {exc}")
            self.problems.append(f"LMTP delivery to {rcpt} failed: {exc}")
            return False
        reply = result.recipients[0].final
        self.p.event("LMTP", f"RCPT {rcpt}: {reply.code} {reply.lines[0] if reply.lines else ''}")
        if reply.code != 250:
            self.problems.append(f"LMTP refused the mail to {rcpt}: {reply}")
            return False
        return True

    def _left(self) -> float:
        return self.until - asyncio.get_running_loop().time()

    async def wait_mails(self, address: str, count: int, what: str) -> bool:
        if await self.sink.wait_for(lambda: len(self.sink.to(address)) >= count, self.until):
            return True
        self.problems.append(f"{what}: no mail reached {address} in time")
        return False

    async def wait_store(self, test: Callable[[Any], bool], what: str) -> bool:
        assert self.app is not None
        assert self.app.store is not None
        store = self.app.store
        while True:
            if await store.read(test):
                return True
            if self._left() <= 0:
                self.problems.append(f"{what}: did not happen in time")
                return False
            await asyncio.sleep(0.05)

    # ---- the story

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.until = loop.time() + SETTLE_SECONDS
        p = self.p

        p.heading("1. A new message opens a case")
        p.line("Ann writes to ticket@help.example, the intake address of type 'ticket'.")
        p.line("masd opens case ticket-1 and acknowledges from the case address.")
        _, mail = compose_mail(
            sender="ann@example.org",
            name="Ann Example",
            to="ticket@help.example",
            subject="My invoice is wrong",
            body="Hello,\n\nthe invoice for March is wrong.\n",
        )
        await self.deliver("ticket@help.example", "ann@example.org", mail)
        await self.wait_mails("ann@example.org", 1, "acknowledgement of ticket-1")

        p.heading("2. A handoff to callback, with the phone number in the mail")
        p.line("Bob writes to ticket!callback@help.example: open a case and call me back.")
        p.line("masd sends handoff.request to the callback endpoint; the endpoint posts")
        p.line("statuses back; on the terminal one (completed) masd mails Bob what happened.")
        _, mail = compose_mail(
            sender="bob@example.net",
            name="Bob Example",
            to="ticket!callback@help.example",
            subject="Please call me about my order",
            body="Hi, please call me back.\n\nphone: +1 555 0100\ntime: this afternoon\n",
        )
        await self.deliver("ticket!callback@help.example", "bob@example.net", mail)
        await self.wait_mails("bob@example.net", 2, "callback for bob@example.net")

        p.heading("3. A handoff to callback that needs negotiation")
        p.line("Carol asks for a callback but gives no phone number. The endpoint answers")
        p.line("'negotiating' with needs [phone]; masd mails Carol the question, and her")
        p.line("reply to the case address goes to the endpoint as handoff.update.")
        _, mail = compose_mail(
            sender="carol@example.com",
            name="Carol Example",
            to="ticket!callback@help.example",
            subject="Call me, please",
            body="Could someone call me about my contract?\n",
        )
        await self.deliver("ticket!callback@help.example", "carol@example.com", mail)
        if await self.wait_mails("carol@example.com", 2, "question to carol@example.com"):
            question = self.sink.to("carol@example.com")[1]
            case_address = email.utils.parseaddr(str(question.message["From"]))[1]
            p.line(f"Carol replies to {case_address} with her number:")
            _, mail = compose_mail(
                sender="carol@example.com",
                name="Carol Example",
                to=case_address,
                subject=_reply_subject(str(question.message["Subject"])),
                body="phone: +1 555 0199\n\nThanks!\n",
                in_reply_to=str(question.message["Message-ID"]),
            )
            await self.deliver(case_address, "carol@example.com", mail)
            await self.wait_mails("carol@example.com", 3, "callback for carol@example.com")

        p.heading("4. A mode that has no endpoint is refused on the spot")
        p.line("Dave asks for chat: enabled for 'ticket' but no endpoint is configured, so")
        p.line("masd records 'refused' (mode-unavailable) itself and continues by email:")
        p.line("the acknowledgement and the notice are one mail.")
        _, mail = compose_mail(
            sender="dave@example.org",
            name="Dave Example",
            to="ticket!chat@help.example",
            subject="Chat?",
            body="Can we chat about this?\n",
        )
        await self.deliver("ticket!chat@help.example", "dave@example.org", mail)
        await self.wait_mails("dave@example.org", 1, "refusal notice to dave@example.org")

        p.heading("5. Automated mail is never answered (Principle 10)")
        p.line("An auto-responder (Auto-Submitted: auto-replied) writes to the intake.")
        p.line("masd records the case but refuses to send the acknowledgement: the refused")
        p.line("send is recorded in the thread as mail.refused (automated-sender).")
        _, mail = compose_mail(
            sender="noreply@shop.example",
            name="Shop",
            to="ticket@help.example",
            subject="Automatic reply: out of office",
            body="I am out of the office.\n",
            headers={"Auto-Submitted": "auto-replied"},
        )
        await self.deliver("ticket@help.example", "noreply@shop.example", mail)
        if await self.wait_store(_has_refused_send, "the refused send to the auto-responder"):
            p.event("masd", "recorded mail.refused (automated-sender); no mail went out")

        await self.wait_store(_settled, "every handoff closed and every outbox row sent")
        return await self.report()

    async def report(self) -> int:
        assert self.app is not None
        assert self.app.store is not None
        p = self.p
        pages = await self.app.store.read(_all_pages)
        p.heading("6. Each case's thread, as masd recorded it")
        p.line("(also on the read side: GET /mas/v0.1/cases/{key}/thread, `masd case show`)")
        for page in pages:
            p.line()
            for text in page.rstrip("\n").splitlines():
                p.line("  " + text)
        p.line()
        if self.problems:
            p.line("The demo did NOT settle:")
            for problem in self.problems:
                p.line(f"  - {problem}")
            for text in await self.app.store.read(_unsettled):
                p.line(f"  - still {text}")
            return 1
        p.line(f"Done: {len(pages)} cases, {len(self.sink.mails)} mails sent, every flow settled.")
        return 0


def _reply_subject(subject: str) -> str:
    return subject if subject.lower().startswith("re:") else f"Re: {subject}"


def _has_refused_send(db: Any) -> bool:
    row = db.execute(
        "SELECT COUNT(*) FROM thread WHERE kind = 'mail.refused' "
        "AND json_extract(data, '$.reason') = 'automated-sender'"
    ).fetchone()
    return bool(row[0])


def _settled(db: Any) -> bool:
    open_handoffs = db.execute("SELECT COUNT(*) FROM handoffs WHERE closed_at IS NULL").fetchone()
    pending = db.execute("SELECT COUNT(*) FROM outbox WHERE state = 'pending'").fetchone()
    return int(open_handoffs[0]) == 0 and int(pending[0]) == 0


def _unsettled(db: Any) -> list[str]:
    out = [
        f"open: handoff {hid[:8]} ({mode}) of {key} is {status}"
        for hid, mode, key, status in db.execute(
            "SELECT handoff_id, mode, case_key, status FROM handoffs WHERE closed_at IS NULL"
        )
    ]
    out += [
        f"pending: outbox row {oid} ({kind} for {key}), {attempts} attempts, last error {error}"
        for oid, kind, key, attempts, error in db.execute(
            "SELECT id, kind, case_key, attempts, last_error FROM outbox WHERE state = 'pending'"
        )
    ]
    return out


def _all_pages(db: Any) -> list[str]:
    keys = [row[0] for row in db.execute("SELECT key FROM cases ORDER BY created_at, rowid")]
    pages = []
    for key in keys:
        case = case_json(db, key)
        if case is not None:
            pages.append(format_case(case, thread_json(db, key, limit=1000)))
    return pages


# --------------------------------------------------------------------------- masd as slave


@dataclass(frozen=True)
class SlavePeers:
    """Where the slave part's outside master and transfers webhook listen, with their secrets."""

    master_url: str
    master_token: str
    webhook_url: str
    webhook_token: str


@dataclass
class CrmCase:
    """What the demo master keeps about a case it owns."""

    address: str
    key: str
    participant: str
    last_message: str  # the message_ref its next mail.send answers
    transfer: bool = False


class DemoMaster(_DemoPeer):
    """An outside master (a small CRM) speaking the master side of the contract.

    It owns the case ids: each ``case.intake`` is answered with ``case.assign``
    under its own numbering (CRM-1001, CRM-1002, ...), then with a
    ``mail.send`` that answers the intake mail.  An intake that asks for a
    call gets its transfers turned to the callback webhook (``case.policy``).
    Every ``case.message`` on a case without a transfer is answered with
    ``mail.send``; a terminal ``handoff.status`` relayed by masd is
    answered with a ``mail.send`` saying how the call went.  It prints
    everything it receives, in the order it arrives.
    """

    path = "/crm"

    def __init__(self, token: str, printer: Printer) -> None:
        super().__init__()
        self.token = token
        self.printer = printer
        self.masd_url = ""
        self.transfer_url = ""
        self.received: list[dict[str, Any]] = []
        self.cases: dict[str, CrmCase] = {}
        self.problems: list[str] = []
        self._seen: set[str] = set()
        self._next_id = 1001

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def _handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(
                {"ok": False, "error": "unauthenticated", "detail": "Authorization: wrong secret"},
                status=401,
            )
        try:
            message = await request.json()
        except ValueError:
            return web.json_response(
                {"ok": False, "error": "invalid-message", "detail": "body: not JSON"}, status=400
            )
        if not isinstance(message, dict) or not isinstance(message.get("id"), str):
            return web.json_response(
                {"ok": False, "error": "invalid-message", "detail": "id: missing"}, status=400
            )
        if message["id"] in self._seen:  # CONTRACT §2: a repeated id is already processed
            return web.json_response({"ok": True})
        self._seen.add(message["id"])
        self.received.append(message)
        self._on(message)
        return web.json_response({"ok": True})

    def _on(self, message: dict[str, Any]) -> None:
        mtype = message.get("type")
        address = (message.get("case") or {}).get("address", "")
        case = self.cases.get(address)
        if mtype == "case.intake":
            event = message.get("event") or {}
            sender = (event.get("from") or {}).get("address")
            mode = message.get("requested_mode")
            self.printer.event(
                "crm",
                f"got case.intake {str(message.get('intake_ref'))[:15]}... from {sender}: "
                f"{event.get('subject')!r}" + (f" (asks for {mode})" if mode else ""),
            )
            self._spawn(self._adopt(message))
        elif mtype == "case.message":
            event = message.get("event") or {}
            self.printer.event(
                "crm",
                f"got case.message on {address} from {(event.get('from') or {}).get('address')}"
                f" to {event.get('rcpt_to')}: {event.get('subject')!r}",
            )
            if case is not None:
                case.last_message = str(message.get("message_ref"))
                if not case.transfer:
                    self._spawn(
                        self._mail(
                            case,
                            "Thanks for your message; we have added it to "
                            f"{case.address}. We answer by email.\n",
                        )
                    )
        elif mtype == "handoff.requested":
            forwarded = message.get("forwarded")
            self.printer.event(
                "crm",
                f"got handoff.requested on {address}: {message.get('mode')}, forwarded "
                + ("true (masd sent it to the transfers webhook)" if forwarded else "false"),
            )
        elif mtype == "handoff.status":
            status = message.get("status")
            extra = "".join(
                f" {name}={message[name]!r}"
                for name in ("needs", "at", "outcome", "reason", "detail")
                if name in message
            )
            self.printer.event(
                "crm", f"got handoff.status on {address}: seq {message.get('seq')} {status}{extra}"
            )
            if case is not None and status in ("completed", "failed", "expired", "refused"):
                self._spawn(
                    self._mail(
                        case,
                        f"Our callback service reports: {status}.\n"
                        + (f"{message['detail']}\n" if "detail" in message else ""),
                    )
                )
        else:
            self.printer.event("crm", f"got {mtype}")

    async def _adopt(self, intake: dict[str, Any]) -> None:
        event = intake.get("event") or {}
        resource_id = f"CRM-{self._next_id}"
        self._next_id += 1
        answer = await self._post(
            "case.assign", None, intake_ref=intake.get("intake_ref"), resource_id=resource_id
        )
        if answer is None:
            return
        ref = answer["case"]
        case = CrmCase(
            ref["address"],
            ref["key"],
            str((event.get("from") or {}).get("address")),
            str(event.get("message_ref")),
        )
        self.cases[case.address] = case
        text = f"Hello,\n\nwe have opened {case.address} for you.\n"
        if "call" in str(event.get("subject") or "").lower():
            # This CRM lets its callback service take calls for this case.
            case.transfer = True
            policy = {"transfers": {"webhook": self.transfer_url}}
            if await self._post("case.policy", case, **policy) is None:
                return
            mode_address = case.address.replace("@", "!callback@", 1)
            text += f"To be called back, write to {mode_address} with your phone number.\n"
        await self._mail(case, text)

    async def _mail(self, case: CrmCase, body: str) -> None:
        await self._post("mail.send", case, in_reply_to=case.last_message, body=body)

    async def _post(
        self, mtype: str, case: CrmCase | None, **payload: Any
    ) -> dict[str, Any] | None:
        assert self._client is not None
        message: dict[str, Any] = {
            "mas_modes_version": "0.1",
            "type": mtype,
            "id": secrets.token_hex(16),
        }
        if case is not None:
            message["case"] = {"address": case.address, "key": case.key}
        message.update(payload)
        async with self._client.post(
            self.masd_url, json=message, headers={"Authorization": f"Bearer {self.token}"}
        ) as response:
            answer = await response.json(content_type=None)
        what = {
            "case.assign": f"case.assign {payload.get('resource_id')}",
            "case.policy": f"case.policy {json.dumps(payload)} for {case.address if case else ''}",
            "mail.send": f"mail.send on {case.address if case else ''}",
        }.get(mtype, mtype)
        self.printer.event("crm", f"posted {what} -> HTTP {response.status} {json.dumps(answer)}")
        if response.status != 200:
            self.problems.append(f"{what} was refused: {answer}")
            return None
        return answer if isinstance(answer, dict) else {}

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class SlavePart:
    """The demo's second part: masd in the slave role, under the demo master."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self.p = demo.p

    async def run(self) -> int:
        demo, p = self.demo, self.p
        demo.problems = []
        demo.until = asyncio.get_running_loop().time() + SETTLE_SECONDS
        assert demo.slave is not None
        demo.crm.transfer_url = demo.slave.webhook_url
        p.line()
        p.line()
        p.line("masd as slave: an outside master owns the cases")
        p.line("=" * 48)
        p.line(f"Type 'case' of {DOMAIN} is in the slave role. Its master is a demo CRM at")
        p.line(f"  {demo.slave.master_url}: it names the cases, decides what is mailed and when")
        p.line("  a case may go to another mode. masd records, reports and carries out.")
        p.line(f"Transfers may go to the callback service at {demo.slave.webhook_url}")
        p.line("  (the type's 'webhooks' entry); the type's default policy is")
        p.line('  {autonomous_send = false, transfers = "block"}.')

        p.heading("7. Intake: masd reports, the master names the case")
        p.line("Erin writes to case@help.example. masd invents no id: it reports case.intake,")
        p.line("the CRM answers with case.assign CRM-1001 and a mail.send to Erin.")
        _, mail = compose_mail(
            sender="erin@example.org",
            name="Erin Example",
            to="case@help.example",
            subject="Where is my parcel?",
            body="Hello,\n\nmy parcel has not arrived.\n",
        )
        await demo.deliver("case@help.example", "erin@example.org", mail)
        if await demo.wait_mails("erin@example.org", 1, "the CRM's answer to erin"):
            answer = demo.sink.to("erin@example.org")[0]
            case_address = email.utils.parseaddr(str(answer.message["From"]))[1]
            p.heading("8. A case message, and a mode under the block policy")
            p.line(f"Erin replies to {case_address.replace('@', '!chat@', 1)}, asking for chat.")
            p.line("masd reports the mail as case.message; the policy blocks transfers, so the")
            p.line("request is reported as handoff.requested with forwarded false, and nothing")
            p.line("else happens. The CRM answers the message with mail.send.")
            chat_address = case_address.replace("@", "!chat@", 1)
            _, mail = compose_mail(
                sender="erin@example.org",
                name="Erin Example",
                to=chat_address,
                subject=_reply_subject(str(answer.message["Subject"])),
                body="Could we chat about it instead?\n",
                in_reply_to=str(answer.message["Message-ID"]),
            )
            await demo.deliver(chat_address, "erin@example.org", mail)
            await demo.wait_mails("erin@example.org", 2, "the CRM's second answer to erin")

        p.heading("9. The master turns on a transfer; the participant asks for a call")
        p.line("Frank asks to be called. The CRM assigns CRM-1002 and sets case.policy")
        p.line("transfers = {webhook: the callback service}; Frank then writes to the")
        p.line("case's !callback address with his number. masd sends handoff.request to the")
        p.line("webhook and relays every status it posts to the CRM, in order; the CRM")
        p.line("tells Frank how it went.")
        _, mail = compose_mail(
            sender="frank@example.net",
            name="Frank Example",
            to="case@help.example",
            subject="Please call me about my contract",
            body="Hello,\n\nI would rather talk on the phone.\n",
        )
        await demo.deliver("case@help.example", "frank@example.net", mail)
        if await demo.wait_mails("frank@example.net", 1, "the CRM's answer to frank"):
            answer = demo.sink.to("frank@example.net")[0]
            case_address = email.utils.parseaddr(str(answer.message["From"]))[1]
            callback_address = case_address.replace("@", "!callback@", 1)
            p.line(f"Frank writes to {callback_address}:")
            _, mail = compose_mail(
                sender="frank@example.net",
                name="Frank Example",
                to=callback_address,
                subject=_reply_subject(str(answer.message["Subject"])),
                body="Please call me.\n\nphone: +1 555 0142\n",
                in_reply_to=str(answer.message["Message-ID"]),
            )
            await demo.deliver(callback_address, "frank@example.net", mail)
            await demo.wait_mails("frank@example.net", 2, "the CRM's report to frank")

        await demo.wait_store(_slave_settled, "every slave handoff closed and every row sent")
        while demo.crm.busy and demo._left() > 0:
            await asyncio.sleep(0.05)
        return await self.report()

    async def report(self) -> int:
        demo, p = self.demo, self.p
        assert demo.app is not None
        assert demo.app.store is not None
        p.heading("10. What the master received, in order")
        for message in demo.crm.received:
            address = (message.get("case") or {}).get("address", "(no case yet)")
            detail = ""
            if message.get("type") == "handoff.status":
                detail = f"  seq {message.get('seq')} {message.get('status')}"
            elif message.get("type") == "handoff.requested":
                detail = (
                    f"  {message.get('mode')} forwarded={str(message.get('forwarded')).lower()}"
                )
            p.line(f"  {message.get('type'):<18} {address}{detail}")
        pages = await demo.app.store.read(_slave_pages)
        p.heading("11. Each slave case's thread, as masd recorded it")
        for page in pages:
            p.line()
            for text in page.rstrip("\n").splitlines():
                p.line("  " + text)
        p.line()
        problems = demo.problems + demo.crm.problems
        if problems:
            p.line("The slave part did NOT settle:")
            for problem in problems:
                p.line(f"  - {problem}")
            for text in await demo.app.store.read(_unsettled):
                p.line(f"  - still {text}")
            return 1
        p.line(
            f"Done: {len(pages)} slave cases, {len(demo.crm.received)} messages to the master, "
            "every slave flow settled."
        )
        return 0


def _slave_settled(db: Any) -> bool:
    open_handoffs = db.execute(
        "SELECT COUNT(*) FROM handoffs h JOIN cases c ON c.key = h.case_key "
        "WHERE c.role = 'slave' AND h.closed_at IS NULL"
    ).fetchone()
    pending = db.execute("SELECT COUNT(*) FROM outbox WHERE state = 'pending'").fetchone()
    handoffs = db.execute(
        "SELECT COUNT(*) FROM handoffs h JOIN cases c ON c.key = h.case_key WHERE c.role = 'slave'"
    ).fetchone()
    return int(open_handoffs[0]) == 0 and int(pending[0]) == 0 and int(handoffs[0]) > 0


def _slave_pages(db: Any) -> list[str]:
    keys = [
        row[0]
        for row in db.execute(
            "SELECT key FROM cases WHERE role = 'slave' ORDER BY created_at, rowid"
        )
    ]
    pages = []
    for key in keys:
        case = case_json(db, key)
        if case is not None:
            pages.append(format_case(case, thread_json(db, key, limit=1000)))
    return pages


async def run_demo(out: TextIO) -> int:
    """Run the demo, writing to ``out``; 0 when every flow settled, else 1."""
    with tempfile.TemporaryDirectory(prefix="masd-demo-") as tmp:
        demo = Demo(out, Path(tmp))
        try:
            await demo.start()
            master_part = await demo.run()
            slave_part = await SlavePart(demo).run()
            return master_part or slave_part
        finally:
            await demo.stop()


def main() -> int:
    """Entry point of ``masd demo``."""
    return asyncio.run(run_demo(sys.stdout))
