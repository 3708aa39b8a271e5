"""The demo's peers of masd: a callback service (a mode endpoint, or the webhook a
master turns transfers to) and a small CRM (the master of the slave part).

Each is a :class:`~masd.testing.peers.FakePeer` whose script is the peer's
logic, and posts back to masd through a :class:`~masd.testing.client.MasdClient`,
each post an act on the :class:`~masd.demo.stage.Stage` (what it receives is
printed as an effect).
"""

from __future__ import annotations

import abc
import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from masd.demo.stage import Stage
from masd.testing.client import MasdClient, envelope
from masd.testing.peers import Answer, FakePeer, Recorded

__all__ = ["CallbackService", "Crm", "CrmCase"]

#: Pause between the statuses the callback service posts.
STEP_SECONDS: Final = 0.2
_OK: Final[Answer] = (200, {"ok": True})
_TERMINAL: Final = frozenset({"completed", "failed", "expired", "refused"})


def _refusal(error: str, detail: str, status: int) -> Answer:
    return status, {"ok": False, "error": error, "detail": detail}


class _DemoPeer(abc.ABC):
    """A fake peer at ``path`` that checks the secret and reads JSON, then ``_on``."""

    path = "/mas"

    def __init__(self, stage: Stage, token: str) -> None:
        self.stage = stage
        self.token = token
        self.fake = FakePeer(self._answer)
        self.masd: MasdClient | None = None  # set once masd listens
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return self.fake.url.rstrip("/") + self.path

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def start(self) -> str:
        await self.fake.start()
        return self.url

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.fake.close()

    async def _answer(self, rec: Recorded) -> Answer:
        if rec.method != "POST" or rec.path != self.path:
            return _refusal("not-found", f"{rec.method} {rec.path}", 404)
        if rec.headers.get("authorization") != f"Bearer {self.token}":
            return _refusal("unauthenticated", "Authorization: wrong secret", 401)
        message = rec.json
        if not isinstance(message, dict):
            return _refusal("invalid-message", "body: not a JSON object", 400)
        return self._on(message)

    @abc.abstractmethod
    def _on(self, message: dict[str, Any]) -> Answer:
        """Answer one contract message from masd."""

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, message: dict[str, Any], url: str | None = None) -> tuple[int, Any]:
        assert self.masd is not None
        response = await self.masd.send(message, self.token, url=url)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text


# --------------------------------------------------------------------------- callback service


@dataclass
class Handoff:
    request: dict[str, Any]
    details: dict[str, str]
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0


class CallbackService(_DemoPeer):
    """A callback service speaking the mode contract: it "calls" the participant.

    It answers ``handoff.request`` at once, then posts ``handoff.status``
    back to the request's ``status_url``: ``scheduled``, ``running``,
    ``completed``.  A request without a ``phone`` first gets ``negotiating``
    with ``needs: ["phone"]``; the service goes on once a
    ``handoff.update`` brings the phone number.
    """

    def __init__(self, stage: Stage, token: str) -> None:
        super().__init__(stage, token)
        self.handoffs: dict[str, Handoff] = {}

    def _on(self, message: dict[str, Any]) -> Answer:
        mtype = message.get("type")
        handoff_id = str(message.get("handoff_id"))
        case = (message.get("case") or {}).get("address")
        details = {str(k): str(v) for k, v in (message.get("details") or {}).items()}
        if mtype == "handoff.request":
            shown = ", ".join(f"{k}={v!r}" for k, v in details.items() if k != "subject")
            self.stage.effect(
                "callback",
                f"got handoff.request for {case} (handoff {handoff_id[:8]}; "
                f"details: {shown or 'none besides the subject'})",
            )
            if handoff_id not in self.handoffs:
                self.handoffs[handoff_id] = Handoff(message, details)
                self._spawn(self._run(self.handoffs[handoff_id]))
            return _OK
        handoff = self.handoffs.get(handoff_id)
        if handoff is None:
            return _refusal("unknown-handoff", f"handoff_id: {handoff_id}", 404)
        if mtype == "handoff.update":
            shown = ", ".join(f"{k}={v!r}" for k, v in details.items())
            self.stage.effect("callback", f"got handoff.update for {case}: {shown}")
            handoff.details.update(details)
            handoff.updated.set()
        elif mtype == "handoff.cancel":
            reason = message.get("reason")
            self.stage.effect("callback", f"got handoff.cancel for {case} (reason {reason})")
        return _OK

    async def _run(self, handoff: Handoff) -> None:
        await asyncio.sleep(STEP_SECONDS)
        while "phone" not in handoff.details:
            handoff.updated.clear()
            await self._post(
                handoff, "negotiating", needs=["phone"], detail="Which number should we call?"
            )
            await handoff.updated.wait()
            await asyncio.sleep(STEP_SECONDS)
        at = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self._post(handoff, "scheduled", at=at)
        await asyncio.sleep(STEP_SECONDS)
        await self._post(handoff, "running")
        await asyncio.sleep(STEP_SECONDS)
        phone = handoff.details["phone"]
        await self._post(handoff, "completed", detail=f"We called {phone} and talked.")

    async def _post(self, handoff: Handoff, status: str, **fields: Any) -> None:
        handoff.seq += 1
        request = handoff.request
        message = envelope(
            "handoff.status",
            case=request["case"],
            handoff_id=request["handoff_id"],
            seq=handoff.seq,
            status=status,
            **fields,
        )
        async with self.stage.act():
            code, answer = await self._send(message, url=request["status_url"])
            extra = f" needs {fields['needs']}" if "needs" in fields else ""
            self.stage.event(
                "callback",
                f"posted handoff.status {status} (seq {handoff.seq}){extra} -> HTTP {code}"
                + ("" if code == 200 else f" {answer}"),
            )


# --------------------------------------------------------------------------- the CRM


@dataclass
class CrmCase:
    """What the CRM keeps about a case it owns."""

    address: str
    key: str
    participant: str
    last_message: str  # the message_ref its next mail.send answers
    transfer: bool = False


class Crm(_DemoPeer):
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

    def __init__(self, stage: Stage, token: str) -> None:
        super().__init__(stage, token)
        self.transfer_url = ""
        self.received: list[dict[str, Any]] = []
        self.cases: dict[str, CrmCase] = {}
        self.problems: list[str] = []
        self._seen: set[str] = set()
        self._next_id = 1001
        self._handlers: dict[str, Callable[[dict[str, Any], CrmCase | None], None]] = {
            "case.intake": self._intake,
            "case.message": self._message,
            "handoff.requested": self._requested,
            "handoff.status": self._status,
        }

    def _on(self, message: dict[str, Any]) -> Answer:
        if not isinstance(message.get("id"), str):
            return _refusal("invalid-message", "id: missing", 400)
        if message["id"] in self._seen:  # docs/protocol.md §7: a repeated id is already processed
            return _OK
        self._seen.add(message["id"])
        self.received.append(message)
        address = (message.get("case") or {}).get("address", "")
        handler = self._handlers.get(str(message.get("type")))
        if handler is None:
            self.stage.effect("crm", f"got {message.get('type')}")
        else:
            handler(message, self.cases.get(address))
        return _OK

    def _intake(self, message: dict[str, Any], case: CrmCase | None) -> None:
        event = message.get("event") or {}
        sender = (event.get("from") or {}).get("address")
        mode = message.get("requested_mode")
        self.stage.effect(
            "crm",
            f"got case.intake {str(message.get('intake_ref'))[:15]}... from {sender}: "
            f"{event.get('subject')!r}" + (f" (asks for {mode})" if mode else ""),
        )
        self._spawn(self._adopt(message))

    def _message(self, message: dict[str, Any], case: CrmCase | None) -> None:
        event = message.get("event") or {}
        self.stage.effect(
            "crm",
            f"got case.message on {_address(message)} from "
            f"{(event.get('from') or {}).get('address')} to {event.get('rcpt_to')}: "
            f"{event.get('subject')!r}",
        )
        if case is not None:
            case.last_message = str(message.get("message_ref"))
            if not case.transfer:
                text = f"Thanks for your message; we have added it to {case.address}."
                self._spawn(self._mail(case, text + " We answer by email.\n"))

    def _requested(self, message: dict[str, Any], case: CrmCase | None) -> None:
        forwarded = message.get("forwarded")
        self.stage.effect(
            "crm",
            f"got handoff.requested on {_address(message)}: {message.get('mode')}, forwarded "
            + ("true (masd sent it to the transfers webhook)" if forwarded else "false"),
        )

    def _status(self, message: dict[str, Any], case: CrmCase | None) -> None:
        status = message.get("status")
        extra = "".join(
            f" {name}={message[name]!r}"
            for name in ("needs", "at", "outcome", "reason", "detail")
            if name in message
        )
        self.stage.effect(
            "crm",
            f"got handoff.status on {_address(message)}: seq {message.get('seq')} {status}{extra}",
        )
        if case is not None and status in _TERMINAL:
            detail = f"{message['detail']}\n" if "detail" in message else ""
            text = f"Our callback service reports: {status}.\n{detail}"
            self._spawn(self._mail(case, text))

    async def _adopt(self, intake: dict[str, Any]) -> None:
        event = intake.get("event") or {}
        resource_id = f"CRM-{self._next_id}"
        self._next_id += 1
        assign = {"intake_ref": intake.get("intake_ref"), "resource_id": resource_id}
        answer = await self._post("case.assign", None, **assign)
        if answer is None:
            return
        ref = answer["case"]
        sender = str((event.get("from") or {}).get("address"))
        case = CrmCase(ref["address"], ref["key"], sender, str(event.get("message_ref")))
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
        message = envelope(mtype, **payload)
        if case is not None:
            message["case"] = {"address": case.address, "key": case.key}
        what = {
            "case.assign": f"case.assign {payload.get('resource_id')}",
            "case.policy": f"case.policy {json.dumps(payload)} for {case.address if case else ''}",
            "mail.send": f"mail.send on {case.address if case else ''}",
        }.get(mtype, mtype)
        async with self.stage.act():
            code, answer = await self._send(message)
            self.stage.event("crm", f"posted {what} -> HTTP {code} {json.dumps(answer)}")
        if code != 200:
            self.problems.append(f"{what} was refused: {answer}")
            return None
        return answer if isinstance(answer, dict) else {}


def _address(message: dict[str, Any]) -> str:
    return str((message.get("case") or {}).get("address", ""))
