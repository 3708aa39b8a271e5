"""File descriptors enough for the listeners' caps (``RLIMIT_NOFILE``).

Every connection a listener holds is a descriptor; so is every store file,
outbound connection and listening socket.  At start masd adds the caps of
the listeners it runs (``server.max_lmtp_sessions``,
``max_http_connections``, ``max_policy_connections``,
``max_milter_connections``) and :data:`MARGIN`, and raises its soft limit to
that sum when it is lower (never above the hard limit, never lowering it).
When the hard limit is lower than the sum, masd does not start:
:class:`DescriptorLimitError` names the limit and the sum, and what to
change.  Under systemd the unit's ``LimitNOFILE=`` sets both limits.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from masd.config import ServerConfig
from masd.core.errors import MasdError

#: Descriptors besides the listeners' connections: the store (a writer and four
#: readers, up to three files each), the relay's connections (8), outbound
#: HTTP to peers (up to 32 in flight to each, kept alive), DKIM key files,
#: the listening sockets, the event loop's own, standard streams.
MARGIN: Final = 256


class DescriptorLimitError(MasdError):
    """The hard limit on open files is below what the connection caps need."""

    code = "descriptor-limit"


@dataclass(frozen=True)
class Need:
    """The descriptors the caps need: each listener's cap and the margin."""

    caps: tuple[tuple[str, int], ...]  # (config key, cap) of each listener run
    margin: int = MARGIN

    @property
    def total(self) -> int:
        return sum(cap for _, cap in self.caps) + self.margin

    def __str__(self) -> str:
        parts = [f"{key} {cap}" for key, cap in self.caps]
        return f"{' + '.join([*parts, f'{self.margin} for the store, peers and relay'])}"


def need(server: ServerConfig, listeners: Iterable[str]) -> Need:
    """What the caps of ``listeners`` (names: lmtp, http, policy, milter, mcp) need."""
    keys = {
        "lmtp": ("server.max_lmtp_sessions", server.max_lmtp_sessions),
        "http": ("server.max_http_connections", server.max_http_connections),
        "policy": ("server.max_policy_connections", server.max_policy_connections),
        "milter": ("server.max_milter_connections", server.max_milter_connections),
        # The MCP listener has the HTTP listener's cap (docs/protocol.md §23).
        "mcp": ("server.max_http_connections (mcp)", server.max_http_connections),
    }
    run = set(listeners)
    return Need(tuple(keys[name] for name in keys if name in run))


def ensure(wanted: Need) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to ``wanted.total`` if it is lower; the
    soft limit in force.  :class:`DescriptorLimitError` when the hard limit
    (or the system's refusal to change it) leaves fewer."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    total = wanted.total
    if soft == resource.RLIM_INFINITY or soft >= total:
        return soft
    if hard != resource.RLIM_INFINITY and hard < total:
        raise DescriptorLimitError(
            f"the limit on open files (RLIMIT_NOFILE) is {hard}, under the {total} the "
            f"connection caps need ({wanted}); raise LimitNOFILE= (ulimit -n) or lower the caps"
        )
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (total, hard))
    except (OSError, ValueError) as exc:
        raise DescriptorLimitError(
            f"the soft limit on open files (RLIMIT_NOFILE) is {soft}, under the {total} the "
            f"connection caps need ({wanted}), and raising it failed: {exc}; "
            "raise LimitNOFILE= (ulimit -n) or lower the caps"
        ) from None
    return total
