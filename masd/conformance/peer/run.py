"""Running the peer kit: each check's steps against the live peer, one output line each.

:class:`Kit` starts the kit's listener (:mod:`~masd.conformance.peer.listener`),
then plays every check in turn: ``send`` posts to the target with the
peer's Bearer secret (or a wrong one, or none) and judges the answer;
``collect`` waits for the peer's posts, answering a ``negotiating`` status
that has ``needs`` with a ``handoff.update`` when the step says so;
``expect`` applies its rule.  The first step that fails fails the check.

Output: ``PASS name (clause): what was seen`` or ``FAIL name (clause): step
N (kind): what differed; seen: ...``, then ``N passed, M failed``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import httpx

from masd.conformance.peer.listener import Answer, KitListener, Post
from masd.conformance.peer.load import Collect, Expect, PeerCheck, Send
from masd.conformance.peer.messages import Factory
from masd.conformance.peer.rules import RULES, Evidence
from masd.core import signing
from masd.core.status import MACHINE

__all__ = ["Kit", "KitOptions", "read_signing", "read_token"]

#: A spell without posts that ends a ``collect`` until "quiet".
QUIET: Final = 1.0


@dataclass(frozen=True)
class KitOptions:
    role: str  # "mode" or "master"
    target: str  # the peer's URL
    token: str = field(repr=False)
    wait: float = 30.0  # longest a collect waits for the peer
    quiet: float = QUIET
    listen: tuple[str, int] = ("127.0.0.1", 0)
    mode: str = "callback"
    domain: str = "help.example"
    case_type: str = "ticket"
    resource_type: str = "case"
    details: Mapping[str, str] = field(default_factory=dict)
    signing_keys: tuple[bytes, ...] = field(default=(), repr=False)


class CheckFailed(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass
class _State:
    """What one check has sent and seen."""

    check: PeerCheck
    first_post: int
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    updated: set[str] = field(default_factory=set)  # status ids answered with an update
    seen: str = ""


class Kit:
    """The kit for one peer: ``await start()``, ``await run(checks, out)``, ``await close()``."""

    def __init__(self, options: KitOptions) -> None:
        self.options = options
        self.listener = KitListener(options.token, self._answer)
        self.factory = Factory(
            status_url="",  # the listener's, once it listens
            mode=options.mode,
            domain=options.domain,
            case_type=options.case_type,
            resource_type=options.resource_type,
            details=options.details,
        )
        self.handoffs: set[str] = set()
        self.intakes: set[str] = set()
        self.assigned: dict[str, dict[str, str]] = {}  # intake_ref -> case
        self.recorded: set[str] = set()  # message_refs sent to a master
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(10.0), trust_env=False)

    async def start(self) -> str:
        """Listen; the URL the peer posts to (a request's ``status_url``)."""
        await self.listener.start(*self.options.listen)
        self.factory.status_url = self.listener.url
        return self.listener.url

    async def close(self) -> None:
        await self._http.aclose()
        await self.listener.close()

    async def run(self, checks: Sequence[PeerCheck], out: TextIO) -> int:
        """Every check in turn; 0 when all pass, else 1."""
        passed = 0
        for check in checks:
            line = await self._one(check)
            passed += line.startswith("PASS")
            print(line, file=out, flush=True)
        print(f"{passed} passed, {len(checks) - passed} failed", file=out, flush=True)
        return 0 if checks and passed == len(checks) else 1

    async def _one(self, check: PeerCheck) -> str:
        state = _State(check, len(self.listener.posts))
        head = f"{check.name} ({check.clause})"
        for number, step in enumerate(check.steps, start=1):
            kind = type(step).__name__.lower()
            try:
                await self._step(state, step)
            except CheckFailed as exc:
                seen = f"; seen: {state.seen}" if state.seen else ""
                return f"FAIL {head}: step {number} ({kind}): {exc.detail}{seen}"
        return f"PASS {head}: {state.seen}"

    async def _step(self, state: _State, step: Send | Collect | Expect) -> None:
        if isinstance(step, Send):
            await self._send(state, step)
        elif isinstance(step, Collect):
            await self._collect(state, step)
        else:
            rule = RULES[self.options.role][step.rule]
            verdict = rule(self._evidence(state, step.of))
            state.seen = verdict.seen
            if verdict.problem is not None:
                raise CheckFailed(f"{step.rule}: {verdict.problem}")

    def _evidence(self, state: _State, name: str) -> Evidence:
        return Evidence(
            message=state.sent[name],
            posts=tuple(self.listener.posts[state.first_post :]),
            recorded=frozenset(self.recorded),
            assigned=dict(self.assigned),
        )

    # ------------------------------------------------------------------ send

    async def _send(self, state: _State, step: Send) -> None:
        message = self._message(state, step)
        if step.name is not None:
            state.sent[step.name] = message
        status, body = await self._post(message, step.secret)
        answer = f"{message['type']} answered {status} {json.dumps(body)[:200]}"
        state.seen = answer
        problem = _judge(step.answer, status, body)
        if problem is not None:
            raise CheckFailed(f"{answer}, expected {problem}")

    def _message(self, state: _State, step: Send) -> dict[str, Any]:
        if step.like is not None:
            return state.sent[step.like]
        subject = f"Conformance check {state.check.name}"
        of = state.sent[step.of] if step.of is not None else {}
        f = self.factory
        if step.message == "handoff.request":
            message = f.handoff_request(subject, all_details=step.details == "all")
            self.handoffs.add(message["handoff_id"])
        elif step.message == "handoff.update":
            message = f.handoff_update(of, [])
        elif step.message == "handoff.cancel":
            message = f.handoff_cancel(of)
        elif step.message == "case.intake":
            message = f.case_intake(subject)
            self.intakes.add(message["intake_ref"])
            self.recorded.add(message["event"]["message_ref"])
        else:
            case = self.assigned.get(str(of.get("intake_ref")))
            if case is None:
                raise CheckFailed("no case.assign yet for the intake this case.message is on")
            message = f.case_message(case, subject)
            self.recorded.add(message["message_ref"])
        return message

    async def _post(self, message: Mapping[str, Any], which: str) -> tuple[int, Any]:
        """POST ``message`` with the peer's secret (``which`` "right"), a wrong one, or none."""
        body = json.dumps(message).encode()
        headers = {"Content-Type": "application/json"}
        if which == "right":
            headers["Authorization"] = f"Bearer {self.options.token}"
        elif which == "wrong":
            headers["Authorization"] = f"Bearer {self.options.token}-not"
        if self.options.signing_keys:
            stamp = int(time.time())
            headers.update(signing.headers(self.options.signing_keys, message["id"], stamp, body))
        try:
            response = await self._http.post(self.options.target, content=body, headers=headers)
        except httpx.HTTPError as exc:
            what = f"{message['type']}: no answer from {self.options.target}: {exc}"
            raise CheckFailed(what) from None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text[:200]

    # ------------------------------------------------------------------ collect

    async def _collect(self, state: _State, step: Collect) -> None:
        message = state.sent[step.of]
        wait, posts = self.options.wait, self.listener.posts
        if step.until == "quiet":
            await self._quiet(state, step, message)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            if step.update_needs:
                await self._answer_needs(state, message)
            if self._reached(step.until, message, posts[state.first_post :]):
                return
            left = deadline - loop.time()
            if left <= 0:
                return  # the rule judges what did arrive
            await self.listener.wait_more(len(posts), left)

    async def _quiet(self, state: _State, step: Collect, message: Mapping[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.wait
        posts = self.listener.posts
        while loop.time() < deadline:
            more = await self.listener.wait_more(len(posts), self.options.quiet)
            if step.update_needs:
                await self._answer_needs(state, message)
            if not more:
                return

    def _reached(self, until: str, message: Mapping[str, Any], posts: list[Post]) -> bool:
        if until == "assign":
            ref = message.get("intake_ref")
            return any(p.type == "case.assign" and p.json.get("intake_ref") == ref for p in posts)
        mine = [
            p
            for p in posts
            if p.type == "handoff.status" and p.json.get("handoff_id") == message.get("handoff_id")
        ]
        if until == "first":
            return bool(mine)
        return any(MACHINE.is_terminal(str(p.json.get("status"))) for p in mine)

    async def _answer_needs(self, state: _State, request: Mapping[str, Any]) -> None:
        """A ``negotiating`` status with ``needs`` not yet answered: send ``handoff.update``."""
        for post in self.listener.posts[state.first_post :]:
            body = post.json
            if not (
                post.type == "handoff.status"
                and body.get("handoff_id") == request.get("handoff_id")
                and body.get("status") == "negotiating"
                and isinstance(body.get("needs"), list)
                and str(body.get("id")) not in state.updated
            ):
                continue
            state.updated.add(str(body.get("id")))
            update = self.factory.handoff_update(request, [str(n) for n in body["needs"]])
            status, answer = await self._post(update, "right")
            if not 200 <= status < 300:
                raise CheckFailed(f"handoff.update answered {status} {json.dumps(answer)[:200]}")

    # ------------------------------------------------------------------ the kit's listener

    def _answer(self, post: Post) -> Answer:
        """Answer a post as email would."""
        body = post.json if isinstance(post.json, dict) else {}
        if self.options.role == "mode":
            if body.get("handoff_id") in self.handoffs:
                return 200, {"ok": True}
            return 404, _refusal("unknown-handoff", f"handoff_id: {body.get('handoff_id')}")
        if post.type == "case.assign":
            ref = str(body.get("intake_ref"))
            if ref not in self.intakes:
                return 404, _refusal("unknown-intake", f"intake_ref: {ref}")
            if ref in self.assigned:
                return 409, _refusal("already-assigned", f"intake_ref: {ref}")
            resource_id = str(body.get("resource_id"))
            address = f"{self.options.resource_type}={resource_id}@{self.options.domain}"
            case = {"address": address, "key": address.lower()}
            self.assigned[ref] = case
            return 200, {"ok": True, "case": case}
        if body.get("case") in self.assigned.values():
            return 200, {"ok": True}
        return 404, _refusal("unknown-case", f"case: {json.dumps(body.get('case'))}")


def _judge(expected: str, status: int, body: Any) -> str | None:
    """None when the answer is the one expected; else what was expected."""
    refusal = (
        isinstance(body, dict)
        and body.get("ok") is False
        and isinstance(body.get("error"), str)
        and isinstance(body.get("detail"), str)
    )
    if expected == "accepted":
        return None if 200 <= status < 300 else "a 2xx"
    if expected == "unauthenticated":
        return None if status == 401 else "401 unauthenticated"
    if 200 <= status < 300 or (400 <= status < 500 and refusal):
        return None
    return 'a 2xx, or a 4xx with {"ok": false, "error": ..., "detail": ...}'


def _refusal(code: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "detail": detail}


def read_token(path: Path) -> str:
    """The peer's Bearer secret: the file's text without its final newline."""
    text = path.read_text(encoding="utf-8")
    token = text[:-1] if text.endswith("\n") else text
    token = token.removesuffix("\r")
    if not token or not all(0x21 <= ord(ch) <= 0x7E for ch in token):
        raise ValueError(f"{path}: not one secret of printable ASCII without spaces")
    return token


def read_signing(path: Path | None) -> tuple[bytes, ...]:
    """The keys of a ``whsec_`` secrets file, one a line (none without a file)."""
    if path is None:
        return ()
    keys = []
    for number, line in enumerate(path.read_text(encoding="ascii").splitlines(), start=1):
        if line.strip():
            try:
                keys.append(signing.parse_secret(line.strip()))
            except ValueError as exc:
                raise ValueError(f"{path} line {number}: the secret {exc}") from None
    if not keys:
        raise ValueError(f"{path}: holds no secret")
    return tuple(keys)
