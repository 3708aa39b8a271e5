"""The steps that check what the target did: contract messages it sent (claimed and
answered), mail it sent, silence, and its read side."""

from __future__ import annotations

import asyncio
import email.utils
import re
from email.message import EmailMessage
from typing import Any, Final

from masd.conformance.acts import short
from masd.conformance.match import match
from masd.conformance.session import Arrival, FlowRun, StepFailure
from masd.conformance.steps import ExpectMailStep, ExpectStep, NothingStep, ReadStep, ReleaseStep
from masd.testing.peers import ReceivedMail
from masd.testing.wait import POLL, poll

__all__ = ["expect", "expect_mail", "nothing", "read", "release"]

#: While a step with ``advance`` waits, the clock moves this often (real seconds).
ADVANCE_EVERY: Final = 0.1
_WAIT_POLL: Final = 0.02
#: Types whose envelope has no ``case`` (docs/protocol.md §7).
_NO_CASE: Final = frozenset({"case.intake", "case.assign"})
_UNFOLD = re.compile(r"\r?\n[ \t]+")


class _Advance:
    """A pause that moves the test clock by ``seconds`` every :data:`ADVANCE_EVERY`.

    For what happens "after some time" without the flow knowing exactly when
    the target scheduled it (a retry's backoff is set when the failure is
    recorded, which the flow cannot see).
    """

    def __init__(self, run: FlowRun, seconds: float | None) -> None:
        self.run = run
        self.seconds = seconds
        self.loop = asyncio.get_running_loop()
        self.next = self.loop.time() + ADVANCE_EVERY

    async def pause(self) -> None:
        await asyncio.sleep(_WAIT_POLL)
        if self.seconds and self.loop.time() >= self.next:
            await self.run.clock(self.seconds)
            self.next = self.loop.time() + ADVANCE_EVERY


# --------------------------------------------------------------------------- contract messages


async def expect(run: FlowRun, step: ExpectStep) -> None:
    """Claim the first unclaimed message to the peer that matches; answer it or hold it."""
    fields = run.vars.fill(dict(step.fields))
    path = None if step.path is None else str(run.vars.fill(step.path))
    found: Arrival | None = None
    closest: str | None = None

    def look() -> bool:
        nonlocal found, closest
        found, closest = _find(run, step.peer, step.type, fields, path)
        return found is not None

    if not await poll(look, within=step.within, pause=_Advance(run, step.advance).pause):
        raise StepFailure(_missing(run, step, closest))
    assert found is not None
    found.claimed = True
    _check_contract(run, found)
    run.capture(step.capture, found.rec.json)
    if step.answer is None:
        found.held = True
    else:
        found.reply.set_result((step.answer.status, run.vars.fill(step.answer.body)))


def _find(
    run: FlowRun, peer: str, mtype: str, fields: Any, path: str | None
) -> tuple[Arrival | None, str | None]:
    closest: str | None = None
    for a in run.arrivals:
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


def _missing(run: FlowRun, step: ExpectStep, closest: str | None) -> str:
    what = f"no {step.type} to {step.peer} within {step.within:g} s"
    if closest is not None:
        return f"{what}; the nearest differs: {closest}"
    others = [a.describe() for a in run.arrivals if not a.claimed]
    return f"{what}" + (f" (unclaimed: {', '.join(others)})" if others else "")


def _check_contract(run: FlowRun, a: Arrival) -> None:
    """What every contract message must be (docs/protocol.md §7, §9, §10)."""
    rec, body = a.rec, a.rec.json
    problems = []
    if rec.method != "POST":
        problems.append(f"method {rec.method}, not POST")
    if not rec.headers.get("content-type", "").startswith("application/json"):
        problems.append(f"Content-Type {rec.headers.get('content-type')!r}")
    if rec.headers.get("authorization") != f"Bearer {run.tokens[a.peer]}":
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


async def release(run: FlowRun, step: ReleaseStep) -> None:
    """Answer the oldest request held for the peer."""
    held = [a for a in run.arrivals if a.peer == step.peer and a.held and not a.reply.done()]
    if not held:
        raise StepFailure(f"no held request to {step.peer} to release")
    held[0].reply.set_result((step.answer.status, run.vars.fill(step.answer.body)))


# --------------------------------------------------------------------------- mail out


async def expect_mail(run: FlowRun, step: ExpectMailStep) -> None:
    """Claim the first unclaimed mail that matches; capture its headers."""
    found: tuple[int, ReceivedMail] | None = None
    closest: str | None = None

    def look() -> bool:
        nonlocal found, closest
        found, closest = _find_mail(run, step)
        return found is not None

    if not await poll(look, within=step.within, pause=_Advance(run, step.advance).pause):
        what = f"no mail{' to ' + step.to if step.to else ''} within {step.within:g} s"
        raise StepFailure(f"{what}; the nearest differs: {closest}" if closest else what)
    assert found is not None
    index, mail = found
    run.claimed_mail.add(index)
    _check_mail(mail)
    message = mail.message
    for name, header in step.capture.items():
        value = message.get(header)
        if value is None:
            raise StepFailure(f"capture {name}: the mail has no {header} header")
        run.vars.values[name] = _unfold(str(value))


def _find_mail(
    run: FlowRun, step: ExpectMailStep
) -> tuple[tuple[int, ReceivedMail] | None, str | None]:
    closest: str | None = None
    to = run.vars.fill(step.to) if step.to else None
    for i, mail in enumerate(run.sink.messages):
        if i in run.claimed_mail:
            continue
        if to is not None and [r.lower() for r in mail.rcpt_tos] != [to.lower()]:
            continue
        diff = _mail_diff(run, step, mail)
        if diff is None:
            return (i, mail), None
        closest = closest or diff
    return None, closest


def _mail_diff(run: FlowRun, step: ExpectMailStep, mail: ReceivedMail) -> str | None:
    message = mail.message
    if step.sender is not None:
        got = email.utils.parseaddr(str(message.get("From", "")))[1]
        want = str(run.vars.fill(step.sender))
        if got.lower() != want.lower():
            return f"From: expected {want}, got {got or '(none)'}"
    for name, expected in step.headers.items():
        value = message.get(name)
        if value is None:
            return f"{name}: missing"
        diff = match(run.vars.fill(expected), _unfold(str(value)), name)
        if diff is not None:
            return diff
    for name in step.absent_headers:
        if name in message:
            return f"{name}: expected no such header, got {_unfold(str(message[name]))!r}"
    return _body_diff(run, step, _text_of(message))


def _body_diff(run: FlowRun, step: ExpectMailStep, text: str) -> str | None:
    for piece in run.vars.fill(list(step.body_contains)):
        if piece not in text:
            return f"body: no {piece!r} in {short(text)}"
    lines = [line.rstrip("\r") for line in text.splitlines()]
    for line in run.vars.fill(list(step.body_lines)):
        if line not in lines:
            return f"body: no line {line!r} in {short(text)}"
    for piece in run.vars.fill(list(step.body_lacks)):
        if piece in text:
            return f"body: {piece!r} should not be there: {short(text)}"
    return None


def _check_mail(mail: ReceivedMail) -> None:
    """What every mail must be (docs/protocol.md §5): To the envelope recipient, a Message-ID
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


# --------------------------------------------------------------------------- silence, read side


async def nothing(run: FlowRun, step: NothingStep) -> None:
    """No contract message and no mail arrives (any already unclaimed fails at once)."""
    left = run.leftovers()
    if not left:
        await asyncio.sleep(step.within)
        left = run.leftovers()
    if left:
        raise StepFailure(f"expected nothing, got {left}")


async def read(run: FlowRun, step: ReadStep) -> None:
    """Read the case (or its thread) until it matches, at most ``within`` seconds."""
    key = str(run.vars.fill(step.case))
    diff: str | None = None

    async def matches() -> bool:
        nonlocal diff
        diff = await _read_once(run, step, key)
        return diff is None

    if not await poll(matches, within=step.within, every=POLL):
        raise StepFailure(str(diff))


async def _read_once(run: FlowRun, step: ReadStep, key: str) -> str | None:
    admin = run.tokens["admin"]
    if not step.thread:
        response = await run.http.case(key, admin)
        if response.status_code != step.status:
            return f"GET case {key}: expected HTTP {step.status}, got {response.status_code}"
        if step.match is None:
            return None
        return match(run.vars.fill(step.match), response.json(), "")
    status, entries = await run.http.thread(key, admin)
    if status != step.status:
        return f"GET thread {key}: expected HTTP {step.status}, got {status}"
    if status != 200:
        return None
    if step.kinds is not None:
        kinds = [e.get("kind") for e in entries]
        if kinds != list(step.kinds):
            return f"thread kinds: expected {list(step.kinds)}, got {kinds}"
    if step.entries is not None:
        return _in_order(run.vars.fill(list(step.entries)), entries)
    return None


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
