"""The enumerations masd stores, each named once.

The store refuses a misspelt value with a ``CHECK`` constraint per column
(:mod:`masd.store.schema`); the code builds its values from the names here.
Handoff statuses are not here: their one source is the transition table,
``conformance/transitions.json`` (:data:`masd.core.status.MACHINE`).
``tests/test_schema.py`` ties every ``CHECK`` of the schema to these names
and to that table, so a value added on one side only fails a test.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

#: A thread entry's kind (docs/protocol.md §16).
ThreadKind = Literal[
    "mail.in",
    "mail.out",
    "mail.refused",
    "status",
    "contract.in",
    "contract.out",
    "delivery.failed",
    "case.erased",
    "mail.bounced",
]
THREAD_KINDS: Final = frozenset(get_args(ThreadKind))

#: A case's role: email is the master of its cases or a slave of an outside master.
Role = Literal["master", "slave"]
ROLES: Final = frozenset(get_args(Role))

#: Who recorded a status: email itself, the mode (endpoint or webhook), or the
#: outside master (a slave case's status it relayed back).
StatusSource = Literal["email", "mode", "master"]
STATUS_SOURCES: Final = frozenset(get_args(StatusSource))

#: What an outbox row carries: a contract message over HTTP, or a mail.
OutboxKind = Literal["contract", "mail"]
OUTBOX_KINDS: Final = frozenset(get_args(OutboxKind))

#: Where an outbox row stands: waiting, delivered, given up, or withdrawn at a
#: handoff's deadline before it went out (docs/protocol.md §12).
OutboxState = Literal["pending", "done", "failed", "abandoned"]
OUTBOX_STATES: Final = frozenset(get_args(OutboxState))
