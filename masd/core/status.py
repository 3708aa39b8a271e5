"""The handoff status machine (docs/protocol.md §14), driven by a table kept as data.

Rules, from the contract:

* A handoff starts at ``(new)`` and its first status is ``requested``,
  "recorded by email when it sends handoff.request".
* Each later status must be one the table allows after the current one:
  "A receiver MUST refuse a transition that the table does not allow
  (error: invalid-transition)."
* "Terminal statuses are completed, failed, expired, refused, cancelled and
  timed-out. Nothing follows a terminal status."
* "timed-out: recorded only by the timeout owner: email as master, or the
  master's own bookkeeping. A mode MUST NOT send it."

The table is ``conformance/transitions.json``; this module only reads it, so
the code, the conformance suite and the docs cannot drift apart.  Besides the
transitions, the table says who may record each status (``recorded_by``):
``email`` (masd itself), ``mode`` (a mode endpoint or transfer webhook) or
``timeout-owner``.

Like h11's state machine, a failed lookup raises an error that names the
handoff's current status, the status asked for and who asked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from masd._resources import conformance_file
from masd.core.errors import TransitionError

NEW: Final = "(new)"

#: Who asks for a status: masd itself, a mode (endpoint or webhook).
Source = Literal["email", "mode"]


@dataclass(frozen=True)
class StatusMachine:
    """The transition table of docs/protocol.md §14 as an immutable value."""

    statuses: frozenset[str]
    terminal: frozenset[str]
    transitions: Mapping[str, frozenset[str]]
    recorded_by: Mapping[str, frozenset[str]]

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> StatusMachine:
        """Build the machine from the JSON table, checking that it is coherent."""
        statuses = frozenset(table["statuses"])
        terminal = frozenset(table["terminal"])
        transitions = {k: frozenset(v) for k, v in table["transitions"].items()}
        recorded_by = {k: frozenset(v) for k, v in table["recorded_by"].items()}
        for src, targets in transitions.items():
            unknown = (targets | ({src} - {NEW})) - statuses
            if unknown:
                raise ValueError(f"transitions.{src}: unknown statuses {sorted(unknown)}")
            if src in terminal:
                raise ValueError(f"transitions.{src}: a terminal status has successors")
        if set(recorded_by) != set(statuses):
            raise ValueError("recorded_by must name every status exactly once")
        return cls(statuses, terminal, transitions, recorded_by)

    def is_terminal(self, status: str) -> bool:
        return status in self.terminal

    def allowed(self, current: str | None) -> frozenset[str]:
        """Statuses that may follow ``current`` (``None`` is a new handoff)."""
        return self.transitions.get(NEW if current is None else current, frozenset())

    def check(
        self,
        current: str | None,
        new: str,
        *,
        source: Source,
        timeout_owner: bool = False,
    ) -> None:
        """Refuse with ``invalid-transition`` unless ``source`` may move ``current`` to ``new``.

        ``timeout_owner`` is true only when masd owns the handoff's deadline
        (the master role, docs/protocol.md §11.2); it is never true for a mode.
        """
        where = NEW if current is None else current
        if new not in self.statuses:
            raise TransitionError(
                f'status: "{new}" is not a status of docs/protocol.md §14 (from {where})'
            )
        if where in self.terminal:
            raise TransitionError(
                f'status: "{new}" after terminal status "{where}"; '
                "nothing follows a terminal status"
            )
        if new not in self.allowed(current):
            raise TransitionError(
                f'status: "{where}" -> "{new}" is not allowed; after "{where}" come '
                + ", ".join(f'"{s}"' for s in sorted(self.allowed(current)))
            )
        who = self.recorded_by[new]
        if "timeout-owner" in who:
            if not (timeout_owner and source == "email"):
                raise TransitionError(
                    f'status: "{new}" is recorded only by the timeout owner, not by {source}'
                )
        elif source not in who:
            raise TransitionError(f'status: "{new}" is not sent by {source}')


def load_machine() -> StatusMachine:
    """Read ``conformance/transitions.json`` (once, at import)."""
    with conformance_file("transitions.json").open("rb") as fh:
        return StatusMachine.from_table(json.load(fh))


#: The machine every part of masd uses.
MACHINE: Final = load_machine()
TERMINAL: Final = MACHINE.terminal
