"""Where inputs meet the store: load state, call the engine, apply its effects.

Every public function here runs inside one store job (the writer thread, one
transaction per input; see :mod:`masd.store`).  It reads the case's state,
asks the pure engine (:mod:`masd.core.engine`, :mod:`masd.core.slave`) what
follows, and applies the effects, so an input and everything it causes
commit together.  One module per input:

- :mod:`~masd.service.intake`: a mail over LMTP (:func:`deliver`), either role;
- :mod:`~masd.service.contract`: a contract message over HTTP (:func:`receive`),
  dispatched by its type;
- :mod:`~masd.service.deadlines`: a handoff's deadline (:func:`fire_deadline`);
- :mod:`~masd.service.outbox`: what an outbox delivery attempt came to;
- :mod:`~masd.service.housekeeping`: expired rows (:func:`purge`);
- :mod:`~masd.service.queue_actions`: an operator's retry or drop of an outbox item;

and :mod:`~masd.service.apply`, the one place effects are carried out, which
returns what it applied.  Principle 10 (docs/protocol.md §4.4) is enforced there, in
the one function every outbound mail passes through.

Beside them, :mod:`~masd.service.runtime` (the configuration as the service
reads it), :mod:`~masd.service.peer_directory` (peers and whom a secret names)
and :mod:`~masd.service.trust_watch` (the running watch on recorded mail's
trust verdicts).
"""

from masd.service.apply import Applied, Recorded, apply
from masd.service.contract import HANDLERS, Received, receive
from masd.service.deadlines import due_deadlines, fire_deadline, next_deadline
from masd.service.housekeeping import (
    DONE_OUTBOX_KEPT,
    IDEMPOTENCY_WINDOW,
    PURGE_BATCH,
    RETIRE_BATCH,
    expired,
    purge,
    retire,
)
from masd.service.intake import DEDUPE_WINDOW, Delivered, already_recorded, dedupe_key, deliver
from masd.service.outbox import (
    backoff,
    next_outbox_at,
    outbox_after,
    outbox_claim,
    outbox_done,
    outbox_done_many,
    outbox_failed,
    outbox_fell_due,
    outbox_heads,
    outbox_orphans,
    outbox_peer_heads,
    outbox_relayed,
    outbox_renew,
    outbox_retry,
    outbox_start_id,
)
from masd.service.runtime import (
    ALL_WAKES,
    MAX_TYPE_VIEWS,
    NO_WAKES,
    CommitListener,
    Job,
    NoListener,
    Runtime,
    UnknownCase,
    Wakes,
)
from masd.service.state import case_exists, load_case, load_handoff, policy_of
from masd.store import OutboxItem

__all__ = [
    "ALL_WAKES",
    "DEDUPE_WINDOW",
    "DONE_OUTBOX_KEPT",
    "HANDLERS",
    "IDEMPOTENCY_WINDOW",
    "MAX_TYPE_VIEWS",
    "NO_WAKES",
    "PURGE_BATCH",
    "RETIRE_BATCH",
    "Applied",
    "CommitListener",
    "Delivered",
    "Job",
    "NoListener",
    "OutboxItem",
    "Received",
    "Recorded",
    "Runtime",
    "UnknownCase",
    "Wakes",
    "already_recorded",
    "apply",
    "backoff",
    "case_exists",
    "dedupe_key",
    "deliver",
    "due_deadlines",
    "expired",
    "fire_deadline",
    "load_case",
    "load_handoff",
    "next_deadline",
    "next_outbox_at",
    "outbox_after",
    "outbox_claim",
    "outbox_done",
    "outbox_done_many",
    "outbox_failed",
    "outbox_fell_due",
    "outbox_heads",
    "outbox_orphans",
    "outbox_peer_heads",
    "outbox_relayed",
    "outbox_renew",
    "outbox_retry",
    "outbox_start_id",
    "policy_of",
    "purge",
    "receive",
    "retire",
]
