"""What a flow is made of, as frozen values: its steps, the flow, and the error
that names a flow's fault by its key path (the JSON format is read by
:mod:`masd.conformance.load`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from masd.core.errors import MasdError

__all__ = [
    "BUILTINS",
    "PEERS",
    "POSTERS",
    "STEP_KINDS",
    "Action",
    "Answer",
    "Auth",
    "ExpectMailStep",
    "ExpectStep",
    "Flow",
    "FlowError",
    "MailStep",
    "NothingStep",
    "PostStep",
    "ReadStep",
    "RelayStep",
    "ReleaseStep",
    "RestartStep",
    "Step",
    "TickStep",
    "parse_duration",
]


class FlowError(MasdError):
    """A flow file that is not a valid flow; ``path`` names the key at fault."""

    code = "bad-flow"

    def __init__(self, detail: str, *, path: str = "", file: str = "") -> None:
        super().__init__(detail)
        self.path = path
        self.file = file

    def __str__(self) -> str:
        where = ": ".join(p for p in (self.file, self.path) if p)
        return f"{where}: {self.detail}" if where else self.detail


#: The fake peers of the runner's standard configuration (see the runner).
PEERS: Final = ("callback", "sms", "master", "other", "webhook")
#: Who may ``post``: a peer, ``admin`` (the admin secret) or ``nobody`` (no secret).
POSTERS: Final = (*PEERS, "admin", "nobody")
#: The kinds of step: the key that names a step in a flow file.
STEP_KINDS: Final = (
    *("mail", "post", "expect", "release", "expect_mail"),
    *("expect_nothing", "tick", "restart", "read", "relay"),
)
#: Variables every flow may use.
BUILTINS: Final = frozenset(
    {"messages_url", "http_url", "domain", "fresh"}
    | {f"peer.{p}.{what}" for p in PEERS for what in ("url", "token", "port")}
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"500ms"``, ``"2s"``, ``"1.5m"``, ``"2h"``, ``"3d"`` in seconds; ValueError otherwise."""
    m = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a duration like 500ms, 2s, 15m, 2h or 3d")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Auth:
    """The Authentication-Results line a ``mail`` step puts on top.

    ``header_from`` None: the domain of the From address.
    """

    authserv_id: str
    dmarc: str
    header_from: str | None = None


@dataclass(frozen=True)
class MailStep:
    """Deliver one mail over LMTP; ``replies`` is the expected reply per recipient."""

    rcpt: tuple[str, ...]
    sender: str = "ann@example.org"
    mail_from: str | None = None  # None: the From address; "" the null sender
    to_header: str | None = None
    subject: str | None = "Help, please"
    body: str = "Hello.\n"
    body_repeat: int = 1
    auth: Auth | None = Auth("mx.help.example", "pass")
    trace: tuple[tuple[str, str], ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()
    message_id: str | None = None  # None: a fresh one
    no_message_id: bool = False
    in_reply_to: str | None = None
    save_as: str | None = None
    again: str | None = None
    replies: tuple[str, ...] | None = None  # None: 250 for every recipient


@dataclass(frozen=True)
class PostStep:
    """Send a contract message (or raw bytes) to the implementation as ``peer``."""

    peer: str
    status: int
    message: Any = None
    raw: str | None = None
    repeat: int = 1
    envelope: bool = True
    headers: tuple[tuple[str, str | None], ...] = ()
    path: str = "/mas/v0.1/messages"
    body: Any = None
    capture: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any


@dataclass(frozen=True)
class ExpectStep:
    """A contract message the implementation must send to ``peer``; ``answer`` None holds it."""

    peer: str
    type: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    capture: Mapping[str, str] = field(default_factory=dict)
    answer: Answer | None = Answer(200, {"ok": True})
    within: float = 5.0
    advance: float | None = None  # test clock seconds to add every ADVANCE_EVERY while waiting
    path: str | None = None  # the request's path at the peer (None: any)


@dataclass(frozen=True)
class ReleaseStep:
    """Answer the oldest request an ``expect`` held (``"answer": "hold"``) for ``peer``."""

    peer: str
    answer: Answer


@dataclass(frozen=True)
class ExpectMailStep:
    """A mail the implementation must send through the relay."""

    to: str | None = None
    sender: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    absent_headers: tuple[str, ...] = ()
    body_contains: tuple[str, ...] = ()
    body_lines: tuple[str, ...] = ()
    body_lacks: tuple[str, ...] = ()
    capture: Mapping[str, str] = field(default_factory=dict)
    within: float = 5.0
    advance: float | None = None


@dataclass(frozen=True)
class NothingStep:
    """No contract message to any peer and no mail within ``within`` (real seconds)."""

    within: float


@dataclass(frozen=True)
class TickStep:
    """Advance the implementation's test clock."""

    seconds: float


@dataclass(frozen=True)
class RestartStep:
    """Stop the implementation (SIGTERM, or SIGKILL with ``kill``) and start it again."""

    kill: bool = False


@dataclass(frozen=True)
class ReadStep:
    """Read the case (or its thread) through the read side and match it."""

    case: str
    thread: bool = False
    status: int = 200
    match: Any = None
    kinds: tuple[str, ...] | None = None
    entries: tuple[Any, ...] | None = None
    within: float = 5.0


@dataclass(frozen=True)
class RelayStep:
    """Make the SMTP relay refuse the next messages, or go down / come back."""

    refuse: str | None = None
    count: int = 1
    at: Literal["DATA", "RCPT"] = "DATA"
    down: bool | None = None


Action = (
    MailStep
    | PostStep
    | ExpectStep
    | ReleaseStep
    | ExpectMailStep
    | NothingStep
    | TickStep
    | RestartStep
    | ReadStep
    | RelayStep
)


@dataclass(frozen=True)
class Step:
    """One step: its kind (the key that names it), its action and an optional note."""

    kind: str
    action: Action
    note: str = ""


@dataclass(frozen=True)
class Flow:
    name: str
    role: Literal["master", "slave"]
    covers: tuple[str, ...]
    description: str
    clock: Literal["test", "real"]
    config: Mapping[str, Any]
    steps: tuple[Step, ...]
    path: Path | None = None
