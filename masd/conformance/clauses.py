"""The clauses a conformance flow can cover: docs/protocol.md §2-§14."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["CLAUSES", "CLAUSE_IDS", "Clause"]


@dataclass(frozen=True)
class Clause:
    """A clause a flow can cover, and the roles it concerns."""

    id: str
    title: str
    roles: frozenset[str]


_BOTH = frozenset({"master", "slave"})
_MASTER = frozenset({"master"})
_SLAVE = frozenset({"slave"})

#: The clauses the flows cover: the contract's (as docs/protocol.md restates them), then
#: the sections of docs/protocol.md that fix what the contract defers.
CLAUSES: Final[tuple[Clause, ...]] = (
    Clause(
        "docs/protocol.md §7", "Parties and transport: envelope, idempotency, seq, responses", _BOTH
    ),
    Clause(
        "docs/protocol.md §11.1", "Master: !MODE sends handoff.request, or email refuses", _MASTER
    ),
    Clause(
        "docs/protocol.md §11.2", "Master: deadline, timed-out, handoff.cancel, resume", _MASTER
    ),
    Clause("docs/protocol.md §11.3", "Master: every status recorded; resume on terminal", _MASTER),
    Clause("docs/protocol.md §11.4", "Master: negotiation by mail, handoff.update", _MASTER),
    Clause("docs/protocol.md §13.1", "Slave: case.intake, case.assign, no invented ids", _SLAVE),
    Clause("docs/protocol.md §13.2", "Slave: inbound mail on a case is case.message", _SLAVE),
    Clause("docs/protocol.md §13.3", "Slave: sending only on mail.send or autonomous_send", _SLAVE),
    Clause("docs/protocol.md §13.4", "Slave: transfers block or webhook, relays", _SLAVE),
    Clause("docs/protocol.md §13.5", "Slave: timeouts belong to the master", _SLAVE),
    Clause("docs/protocol.md §14", "Handoff status machine", _BOTH),
    Clause("docs/protocol.md §8", "Message types", _BOTH),
    Clause("docs/protocol.md §4.4", "Principle 10 in both roles", _BOTH),
    Clause("docs/protocol.md §2", "Addresses", _BOTH),
    Clause("docs/protocol.md §3", "LMTP replies", _BOTH),
    Clause("docs/protocol.md §4", "Trust, automation and Principle 10", _BOTH),
    Clause("docs/protocol.md §5", "Outbound mail", _BOTH),
    Clause("docs/protocol.md §6", "Details and negotiation", _BOTH),
    Clause("docs/protocol.md §9", "HTTP listener", _BOTH),
    Clause("docs/protocol.md §10", "Outbound contract messages", _BOTH),
    Clause("docs/protocol.md §12", "Master-role timeouts", _MASTER),
    Clause("docs/protocol.md §13", "Slave role", _SLAVE),
)
CLAUSE_IDS: Final = frozenset(c.id for c in CLAUSES)
