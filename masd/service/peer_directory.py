"""Peers of masd and who a credential says a caller is (docs/protocol.md §9).

"each peer (mode endpoint, master, webhook) has a secret in a file ...  The
sender's identity is the peer whose secret matched, never a field of the
message."  A peer's id is stable text recorded with every handoff, so a
status is accepted only from the peer its handoff was sent to.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from masd.config import Config, Signing
from masd.config.model import NO_SIGNING

PeerKind = Literal["mode", "master", "webhook"]


@dataclass(frozen=True)
class Peer:
    id: str
    kind: PeerKind
    domain: str
    type: str
    url: str
    token: str
    mode: str | None = None
    fields: tuple[str, ...] = ()
    deadline: float | None = None
    signing: Signing = NO_SIGNING


@dataclass(frozen=True)
class Principal:
    """Who a request's secret authenticated: every peer entry holding that secret."""

    kind: PeerKind
    peers: tuple[Peer, ...]

    @property
    def id(self) -> str:
        """The idempotency scope: one id per secret."""
        return self.peers[0].id

    def covers(self, peer_id: str) -> bool:
        return any(p.id == peer_id for p in self.peers)

    def serves(self, domain: str, type_: str) -> bool:
        return any(p.domain == domain and p.type == type_ for p in self.peers)


def mode_peer_id(domain: str, type_: str, mode: str) -> str:
    return f"mode:{domain}/{type_}/{mode}"


def master_peer_id(domain: str, type_: str) -> str:
    return f"master:{domain}/{type_}"


def webhook_peer_id(domain: str, type_: str, url: str) -> str:
    return f"webhook:{domain}/{type_}/{url}"


def peers_of(config: Config) -> tuple[Peer, ...]:
    out: list[Peer] = []
    for domain in config.domains.values():
        for typ in domain.types.values():
            for mode, ep in typ.endpoints.items():
                out.append(
                    Peer(
                        mode_peer_id(domain.name, typ.name, mode),
                        "mode",
                        domain.name,
                        typ.name,
                        ep.url,
                        ep.token,
                        mode,
                        ep.fields,
                        ep.deadline,
                        ep.signing,
                    )
                )
            if typ.master is not None:
                m = typ.master
                out.append(
                    Peer(
                        master_peer_id(domain.name, typ.name),
                        "master",
                        domain.name,
                        typ.name,
                        m.url,
                        m.token,
                        signing=m.signing,
                    )
                )
            for wh in typ.webhooks:
                out.append(
                    Peer(
                        webhook_peer_id(domain.name, typ.name, wh.url),
                        "webhook",
                        domain.name,
                        typ.name,
                        wh.url,
                        wh.token,
                        None,
                        wh.fields,
                        signing=wh.signing,
                    )
                )
    return tuple(out)


class Directory:
    """Looks peers up by id and by secret (constant-time comparison)."""

    def __init__(self, peers: Iterable[Peer]) -> None:
        self.peers = tuple(peers)
        self.by_id = {p.id: p for p in self.peers}

    def authenticate(self, secret: str) -> Principal | None:
        given = secret.encode()
        # Compare with every secret, whatever matches, so timing tells nothing.
        matched = [p for p in self.peers if hmac.compare_digest(p.token.encode(), given)]
        if not matched:
            return None
        kind = matched[0].kind
        return Principal(kind, tuple(p for p in matched if p.kind == kind))
