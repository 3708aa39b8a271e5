"""How often one client may try the admin secret at the console's sign-in.

Each client (its address; an IPv6 address by its ``/64``, the block one host is usually
given) may get the secret wrong :data:`FREE` times; from then on every wrong try makes it
wait before the next: :data:`FIRST_DELAY` seconds, twice as long after each further wrong
try, at most :data:`LONGEST_DELAY`.  While it waits every try is refused without its secret
being compared (the right secret too: a guesser learns nothing from a refused try),
answered ``429`` with ``Retry-After`` at once: nothing waits on the event loop or holds a
connection, and other clients are not slowed.  A right secret after the wait forgets the
client's failures; so do :data:`FORGET` seconds without a wrong try.

At most :data:`MAX_CLIENTS` clients are remembered (the one whose last try is oldest makes
room), so a flood from many addresses costs bounded memory.  The caller logs what
:meth:`SignInThrottle.refuse` and :meth:`SignInThrottle.failed` say to log: one line per
throttled client per :data:`LOG_EVERY` seconds, however many tries it makes.

Pure: times are the caller's clock (seconds); nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

#: Wrong secrets a client may give before it has to wait.
FREE: Final = 5
#: Seconds the first wait lasts; each wrong try after it doubles the wait.
FIRST_DELAY: Final = 1.0
#: The longest wait.
LONGEST_DELAY: Final = 300.0
#: Seconds without a wrong try after which a client's failures are forgotten.
FORGET: Final = 900.0
#: Clients remembered at once.
MAX_CLIENTS: Final = 10_000
#: At most one log line per throttled client in this many seconds.
LOG_EVERY: Final = 60.0


def client_of(remote: str | None) -> str:
    """The client a peer address belongs to: an IPv4 address as itself (an IPv4-mapped
    IPv6 one too), an IPv6 address as its ``/64``, anything else (a unix socket) as
    itself or ``"local"``."""
    if not remote:
        return "local"
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def delay_after(failures: int) -> float:
    """Seconds a client waits after ``failures`` wrong secrets in a row."""
    if failures < FREE:
        return 0.0
    return min(LONGEST_DELAY, FIRST_DELAY * 2.0 ** min(failures - FREE, 32))


@dataclass
class _Client:
    failures: int = 0
    last: float = 0.0  # the last wrong try
    until: float = 0.0  # refused until
    refused: int = 0  # tries refused since the last log line
    logged: float = -math.inf  # when a line about it was last logged


@dataclass(frozen=True)
class Throttled:
    """A client made to wait: the whole seconds to send as ``Retry-After``, its wrong tries
    in a row, and, when a log line is due (else None), the tries refused since the last."""

    retry_after: int
    failures: int
    log_refused: int | None


class SignInThrottle:
    """The sign-in's memory of wrong secrets (one per HTTP edge, beside its sessions)."""

    def __init__(self, *, max_clients: int = MAX_CLIENTS) -> None:
        self.max_clients = max_clients
        self._clients: OrderedDict[str, _Client] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def refuse(self, client: str, now: float) -> Throttled | None:
        """A try from ``client`` at ``now``: :class:`Throttled` while it must wait (the try
        is then not to be read at all), else None."""
        found = self._live(client, now)
        if found is None or now >= found.until:
            return None
        found.refused += 1
        return self._throttled(found, now)

    def failed(self, client: str, now: float) -> Throttled | None:
        """``client`` gave a wrong secret at ``now``: :class:`Throttled` when this starts a
        wait, else None."""
        found = self._live(client, now)
        if found is None:
            found = self._clients[client] = _Client()
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        self._clients.move_to_end(client)
        found.failures += 1
        found.last = now
        wait = delay_after(found.failures)
        if wait <= 0:
            return None
        found.until = now + wait
        return self._throttled(found, now)

    def succeeded(self, client: str) -> None:
        """``client`` signed in: its failures are forgotten."""
        self._clients.pop(client, None)

    def _live(self, client: str, now: float) -> _Client | None:
        found = self._clients.get(client)
        if found is not None and now >= max(found.until, found.last + FORGET):
            del self._clients[client]
            return None
        return found

    def _throttled(self, found: _Client, now: float) -> Throttled:
        retry_after = max(1, math.ceil(found.until - now))
        if now - found.logged < LOG_EVERY:
            return Throttled(retry_after, found.failures, None)
        said, found.refused, found.logged = found.refused, 0, now
        return Throttled(retry_after, found.failures, said)
