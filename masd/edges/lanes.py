"""Per-peer lanes of the outbox: an in-flight limit and a circuit (docs/protocol.md §10
"Isolation").

Every destination has a lane: each peer by URL origin (scheme, host, port)
and the SMTP relay (:data:`RELAY`).  A lane lets at most ``limit`` sends be
in flight; an outcome waiting to be recorded still holds its slot, so a
store that refuses writes stops each lane after ``limit`` sends instead of
letting it send its whole backlog.

The circuit is the lane's own backoff.  Closed, the lane sends freely.
After :data:`FAILURES_TO_OPEN` failures in a row (5xx, timeout, no
connection; for the relay, a 4xx or no connection) it opens and sends
nothing for a cool-down that grows like the rows' backoff (1 s to 5 min,
with jitter).  Then it lets one send through as a probe: an answer closes
it, a failure opens it again for longer.  So a peer that hangs or fails
holds only its own slots, and the rows behind it wait without being tried.

Time here is the injected clock's (epoch seconds), passed in by the caller.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit

from masd.service import backoff

#: The lane of every mail (``server.smtp_relay``).
RELAY: Final = "smtp"
#: Failures in a row that open a closed circuit.
FAILURES_TO_OPEN: Final = 5

Result = Literal["done", "failed", "retry"]
Event = Literal["opened", "reopened", "closed"]

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Attempt:
    """What one send came to, and what it says about its lane.

    ``result``: done, failed for good, or retry.  ``healthy``: the peer
    answered (True), failed to (False: 5xx, timeout, no connection), or was
    never asked (None: nothing could be sent).
    """

    result: Result
    detail: str = ""
    healthy: bool | None = True


@functools.lru_cache(maxsize=4096)
def origin(url: str) -> str | None:
    """``scheme://host:port`` of ``url`` (default port filled in), or None if it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if not scheme or not host:
        return None
    port = port or _DEFAULT_PORTS.get(scheme)
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}" if port else f"{scheme}://{host}"


@dataclass
class Lane:
    """One destination's in-flight count and circuit."""

    key: str
    limit: int
    in_flight: int = 0
    failures: int = 0  # in a row
    openings: int = 0  # in a row: the cool-down grows with them
    open_until: float | None = None  # None: closed
    probing: bool = False  # the one send let through after a cool-down is out

    def admits(self, now: float) -> bool:
        if self.in_flight >= self.limit:
            return False
        if self.open_until is None:
            return True
        return now >= self.open_until and not self.probing


class Lanes:
    """All lanes, created on first use; ``limit_of(key)`` gives a new lane its limit."""

    def __init__(
        self,
        limit_of: Callable[[str], int],
        *,
        failures_to_open: int = FAILURES_TO_OPEN,
        rng: random.Random | None = None,
    ) -> None:
        self._limit_of = limit_of
        self._failures_to_open = failures_to_open
        self._rng = rng
        self._lanes: dict[str, Lane] = {}

    def __getitem__(self, key: str) -> Lane:
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key, max(1, self._limit_of(key)))
        return lane

    def take(self, key: str, now: float) -> bool | None:
        """Take a slot if the lane admits a send now: None if not, else whether it is a probe."""
        lane = self[key]
        if not lane.admits(now):
            return None
        lane.in_flight += 1
        if lane.open_until is not None:
            lane.probing = True
            return True
        return False

    def release(self, key: str) -> None:
        """Give a slot back (its outcome is recorded, or given up)."""
        lane = self[key]
        lane.in_flight = max(0, lane.in_flight - 1)

    def judge(self, key: str, healthy: bool | None, now: float, *, probe: bool) -> Event | None:
        """Count one send's verdict on its lane; returns what became of the circuit, if anything."""
        lane = self[key]
        if probe:
            lane.probing = False
        if healthy is None:
            return None
        if healthy:
            was_open = lane.open_until is not None
            lane.failures = lane.openings = 0
            lane.open_until = None
            return "closed" if was_open else None
        lane.failures += 1
        if probe or (lane.open_until is None and lane.failures >= self._failures_to_open):
            lane.openings += 1
            lane.open_until = now + backoff(lane.openings, self._rng)
            return "reopened" if probe else "opened"
        return None

    def rooms(self, now: float) -> dict[str, int]:
        """How many sends each lane admits now (a lane whose circuit waits for a probe: one)."""
        out: dict[str, int] = {}
        for key, lane in self._lanes.items():
            if lane.admits(now):
                out[key] = 1 if lane.open_until is not None else lane.limit - lane.in_flight
        return out

    def next_open(self, now: float) -> float | None:
        """When the next open circuit lets a probe through (a time after ``now``), if any."""
        times = [
            lane.open_until
            for lane in self._lanes.values()
            if lane.open_until is not None and lane.open_until > now
        ]
        return min(times, default=None)
