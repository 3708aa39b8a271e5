"""The steps that act on the target: mail over LMTP, contract messages over HTTP,
the test clock, a restart, the relay's refusals."""

from __future__ import annotations

import email.utils
import json
import re
import secrets
from collections.abc import Callable
from typing import Any

from masd.conformance.match import match
from masd.conformance.session import FlowRun, StepFailure
from masd.conformance.steps import MailStep, PostStep, RelayStep, RestartStep, TickStep
from masd.testing import lmtpclient
from masd.testing.client import bearer, envelope
from masd.testing.config import DOMAIN
from masd.testing.inbound import mx_trace

__all__ = ["build_mail", "mail", "post", "relay", "restart", "short", "tick"]


async def mail(run: FlowRun, step: MailStep) -> None:
    """Deliver over LMTP; each recipient's reply must be the one the step names."""
    if step.again is not None:
        mail_from, rcpt, raw = run.saved[step.again]
        rcpt = tuple(run.vars.fill(list(step.rcpt))) or rcpt
    else:
        mail_from, raw, message_id = build_mail(step, run.vars.fill)
        rcpt = tuple(run.vars.fill(list(step.rcpt)))
        if step.save_as:
            run.vars.values[f"{step.save_as}.message_id"] = message_id
    if step.save_as:
        run.saved[step.save_as] = (mail_from, rcpt, raw)
    result = await lmtpclient.deliver(
        ("127.0.0.1", run.lmtp_port), mail_from, list(rcpt), raw, timeout=30.0
    )
    wanted = step.replies or tuple("250" for _ in rcpt)
    if len(wanted) != len(rcpt):
        raise StepFailure(f"{len(wanted)} replies expected for {len(rcpt)} recipients")
    for address, want, got in zip(rcpt, wanted, result.recipients, strict=True):
        text = str(got.final)
        if not (text == want or text.startswith(want + " ")):
            raise StepFailure(f"recipient {address}: expected reply {want}, got {text!r}")


async def post(run: FlowRun, step: PostStep) -> None:
    """POST as the step's peer; the status (and body) must be the ones it names."""
    headers: dict[str, str] = {"Content-Type": "application/json"}
    if step.peer != "nobody":
        headers.update(bearer(run.tokens[step.peer]))
    for name, value in step.headers:
        for existing in [h for h in headers if h.lower() == name.lower()]:
            del headers[existing]
        if value is not None:
            headers[name] = str(run.vars.fill(value))
    if step.raw is not None:
        body = (str(run.vars.fill(step.raw)) * step.repeat).encode("utf-8")
    else:
        message = run.vars.fill(step.message)
        if step.envelope:
            message = envelope(**message)
        body = json.dumps(message).encode("utf-8")
    response = await run.http.http.post(step.path, content=body, headers=headers)
    try:
        got: Any = response.json()
    except ValueError:
        got = response.text
    if response.status_code != step.status:
        raise StepFailure(f"expected HTTP {step.status}, got {response.status_code} {short(got)}")
    if step.body is not None:
        diff = match(run.vars.fill(step.body), got, "body")
        if diff is not None:
            raise StepFailure(diff)
    run.capture(step.capture, got)


async def tick(run: FlowRun, step: TickStep) -> None:
    await run.clock(step.seconds)


async def restart(run: FlowRun, step: RestartStep) -> None:
    """Stop the target (nothing may be pending) and start it on the same timeline."""
    left = run.leftovers()
    if left:
        raise StepFailure(f"unexpected before the restart: {left}")
    if any(a.held and not a.reply.done() for a in run.arrivals):
        raise StepFailure("a held request was not released before the restart")
    before = await run.clock(0) if run.flow.clock == "test" else 0.0
    code = await run.stop_target(kill=step.kill)
    if not step.kill and code != 0:
        raise StepFailure(f"the target exited with {code} on SIGTERM, not 0")
    await run.start_target()
    if run.flow.clock == "test":
        # One flow, one timeline: the new process's clock resumes where the old one was.
        after = await run.clock(0)
        if before > after:
            await run.clock(before - after)


async def relay(run: FlowRun, step: RelayStep) -> None:
    if step.refuse is not None:
        run.sink.refuse(step.refuse, step.count, at=step.at)
    else:
        await run.sink.set_down(bool(step.down))


def short(value: Any) -> str:
    """A value quoted on one line, cut at 160 characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return repr(text) if len(text) <= 160 else repr(text[:160] + "…")


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
    if step.trace is not None:
        trace = [(n, str(fill(v))) for n, v in step.trace]
    elif step.auth is not None:
        auth = step.auth
        trace = mx_trace(
            domain,
            dmarc=auth.dmarc,
            authserv_id=auth.authserv_id,
            header_from=auth.header_from,
            date=date,
        )
    else:
        trace = mx_trace(domain, dmarc=None, date=date)
    body = str(fill(step.body)) * step.body_repeat
    headers = trace + _headers(step, fill, sender, date, message_id, body.isascii())
    text = "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n" + body
    raw = re.sub(r"\r?\n", "\r\n", text).encode("utf-8")
    return mail_from, raw, message_id


def _headers(
    step: MailStep,
    fill: Callable[[Any], Any],
    sender: str,
    date: str,
    message_id: str,
    ascii_body: bool,
) -> list[tuple[str, str]]:
    """The message's own headers: defaults the step's ``headers`` do not replace, then those."""
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
    defaults += [
        ("MIME-Version", "1.0"),
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Transfer-Encoding", "7bit" if ascii_body else "8bit"),
    ]
    extra = [(n, str(fill(v))) for n, v in step.headers]
    given = {n.lower() for n, _ in extra}
    return [(n, v) for n, v in defaults if n.lower() not in given] + extra
