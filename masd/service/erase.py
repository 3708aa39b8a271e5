"""Erasing one case at an operator's word (docs/operations.md, "Erasing a case").

One store job: the case's open handoff is cancelled (a ``handoff.cancel``
with reason ``erased`` queued for its mode), then every row of the case is
removed (:func:`masd.store.retention.erase_case`), leaving one
``case.erased`` entry in the feed.  The case's own outbox rows go with it,
so the cancel, queued after them, is the one thing of the case still sent:
the job's :class:`~masd.service.Wakes` name the case, and the outbox breaks
off a send of its that is under way once the erase has committed
(:meth:`masd.edges.outbox.Outbox.abandon`).
"""

from __future__ import annotations

from dataclasses import dataclass

from masd.core.errors import MasdError
from masd.core.wire import envelope
from masd.service.runtime import Runtime, Wakes
from masd.service.state import load_case
from masd.store import Tx, outbox, retention

#: The reason the mode is given for the cancel.
REASON = "erased"


class UnknownCase(MasdError):
    """There is no case of that key (none was, or it is erased already)."""

    code = "unknown-case"


@dataclass(frozen=True)
class Erased:
    """What one erase removed (rows per table), where its ``case.erased`` entry
    stands in the feed, and what it woke."""

    counts: dict[str, int]
    pos: int
    wakes: Wakes


def erase(rt: Runtime, tx: Tx, key: str, now: float) -> Erased:
    """Erase case ``key``; :class:`UnknownCase` if there is none."""
    case = load_case(rt, tx, key)
    erased = None if case is None else retention.erase_case(tx, key, now)
    if case is None or erased is None:
        raise UnknownCase(f"key: no case {key}")
    counts, pos = erased
    handoff, wakes = case.open_handoff, Wakes(erased=frozenset({case.key}))
    if handoff is not None and handoff.url is not None:
        cancel = envelope(
            "handoff.cancel",
            f"cancel-{handoff.handoff_id}",
            case.ref,
            handoff_id=handoff.handoff_id,
            reason=REASON,
        )
        queue = f"{case.key}|{handoff.peer}"
        row = outbox.NewRow("contract", queue, handoff.peer, case.key, handoff.url, cancel)
        outbox.queue(tx, row, now, now + rt.config.server.retry_for)
        wakes = Wakes(outbox=True, erased=wakes.erased)
    return Erased(counts, pos, wakes)
