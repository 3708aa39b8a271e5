"""What every edge works with, in one value: the seam between the edges and the rest.

An edge (LMTP, HTTP, policy, outbox, deadline timer) is built from one
:class:`EdgeContext`: the runtime (config, peers, ids), the store, the
clock, the counters, and the listener it tells what each of its committed
store jobs woke (:class:`~masd.service.CommitListener`; the app's wakes the
outbox and the deadline timer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from masd.clock import Clock
from masd.metrics import Metrics
from masd.service import CommitListener, NoListener, Runtime
from masd.store import StoreHandle


@dataclass(frozen=True)
class EdgeContext:
    """The runtime, store, clock, metrics and commit listener an edge shares with the others."""

    rt: Runtime
    store: StoreHandle
    clock: Clock = field(default_factory=Clock)
    metrics: Metrics = field(default_factory=Metrics)
    listener: CommitListener = field(default_factory=NoListener)
