"""The clauses a conformance flow can cover: CONTRACT §2-§6 and PROFILE §1-§9."""

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

#: Every clause of CONTRACT §2-§6 and PROFILE §1-§9, in document order.
CLAUSES: Final[tuple[Clause, ...]] = (
    Clause("CONTRACT §2", "Parties and transport: envelope, idempotency, seq, responses", _BOTH),
    Clause("CONTRACT §3.1.1", "Master: !MODE sends handoff.request, or email refuses", _MASTER),
    Clause("CONTRACT §3.1.2", "Master: deadline, timed-out, handoff.cancel, resume", _MASTER),
    Clause("CONTRACT §3.1.3", "Master: every status recorded; resume on terminal", _MASTER),
    Clause("CONTRACT §3.1.4", "Master: negotiation by mail, handoff.update", _MASTER),
    Clause("CONTRACT §3.2.1", "Slave: case.intake, case.assign, no invented ids", _SLAVE),
    Clause("CONTRACT §3.2.2", "Slave: inbound mail on a case is case.message", _SLAVE),
    Clause("CONTRACT §3.2.3", "Slave: sending only on mail.send or autonomous_send", _SLAVE),
    Clause("CONTRACT §3.2.4", "Slave: transfers block or webhook, relays", _SLAVE),
    Clause("CONTRACT §3.2.5", "Slave: timeouts belong to the master", _SLAVE),
    Clause("CONTRACT §4", "Handoff status machine", _BOTH),
    Clause("CONTRACT §5", "Message types", _BOTH),
    Clause("CONTRACT §6", "Principle 10 in both roles", _BOTH),
    Clause("PROFILE §1", "Addresses", _BOTH),
    Clause("PROFILE §2", "LMTP replies", _BOTH),
    Clause("PROFILE §3", "Trust, automation and Principle 10", _BOTH),
    Clause("PROFILE §4", "Outbound mail", _BOTH),
    Clause("PROFILE §5", "Details and negotiation", _BOTH),
    Clause("PROFILE §6", "HTTP listener", _BOTH),
    Clause("PROFILE §7", "Outbound contract messages", _BOTH),
    Clause("PROFILE §8", "Master-role timeouts", _MASTER),
    Clause("PROFILE §9", "Slave role", _SLAVE),
)
CLAUSE_IDS: Final = frozenset(c.id for c in CLAUSES)
