"""Named refusals raised by the core.

Every refusal masd makes carries a stable ``code`` (what kind of refusal) and
a ``detail`` (what exactly was refused and why: the part, the field, the
value).  Edges map codes to LMTP replies, HTTP statuses or exit codes; they
never show a traceback to a peer.  The core knows no HTTP status: a contract
answer is named by its kind (:data:`Answer`), and the HTTP edge's table
(:data:`masd.edges.http.shared.REPLIES`) gives each kind its status.

    MasdError
    ├── AddressError        a recipient that is not a MAS address here
    ├── ConfigError         a configuration key with a bad value
    ├── EventError          a message that cannot become a gateway event
    ├── TransitionError     a status the table does not allow (invalid-transition)
    └── WireError           a contract message that is refused (a :data:`Refusal`)
"""

from __future__ import annotations

from typing import Literal

#: Why a contract message is refused, by the contract's error names (docs/protocol.md §9.3).
Refusal = Literal[
    "invalid-message",
    "unsupported-version",
    "unknown-type",
    "forbidden",
    "unknown-case",
    "unknown-handoff",
    "unknown-intake",
    "invalid-transition",
    "already-assigned",
]
#: What a contract answer is: ``ok``, ``refused`` (``mail.send`` under Principle 10,
#: docs/protocol.md §4.4) or a :data:`Refusal`.
Answer = Literal["ok", "refused", Refusal]


class MasdError(Exception):
    """Base of every named refusal: ``code`` is stable, ``detail`` is for people."""

    code: str = "error"

    def __init__(self, detail: str, *, code: str | None = None) -> None:
        super().__init__(detail)
        if code is not None:
            self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


class AddressError(MasdError):
    """A recipient address that masd refuses (docs/protocol.md §2).

    ``part`` names the part of the address at fault: ``address``, ``local``,
    ``type``, ``id``, ``mode`` or ``domain`` (``key`` for an envelope's case key).
    ``code`` is ``unknown-domain`` when the domain is not configured here (LMTP
    ``550 5.1.2``) and ``bad-address`` otherwise (LMTP ``550 5.1.1``).
    """

    code = "bad-address"

    def __init__(self, detail: str, *, part: str, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.part = part


class ConfigError(MasdError):
    """A configuration error; ``path`` is the dotted key path at fault, ``file``
    the file it is in when that is not the main file (a ``domains_dir`` file)."""

    code = "bad-config"

    def __init__(self, detail: str, *, path: str = "", file: str = "") -> None:
        super().__init__(detail)
        self.path = path
        self.file = file

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.path) if part)
        return f"{where}: {self.detail}" if where else self.detail


class EventError(MasdError):
    """A message that cannot be turned into a gateway event (docs/protocol.md §15)."""

    code = "bad-message"


class TransitionError(MasdError):
    """A handoff status the status machine does not allow (docs/protocol.md §14)."""

    code: Literal["invalid-transition"] = "invalid-transition"


class WireError(MasdError):
    """A contract message refused (docs/protocol.md §9): ``code`` is the contract's
    ``error`` value, the refusal's kind."""

    code: Refusal = "invalid-message"

    def __init__(self, detail: str, *, code: Refusal = "invalid-message") -> None:
        super().__init__(detail, code=code)
