"""What every input is handled with: the runtime (config, peers, ids), the
running job, and what a committed job woke."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Protocol

from masd.config import Config, TypeConfig, webhook_for
from masd.core.engine import Context, EndpointView, Peer, PolicyView, TypeView
from masd.core.errors import MasdError
from masd.core.slave import SlaveTerms, Transfer
from masd.core.trust import TrustSettings
from masd.service.peer_directory import (
    Directory,
    master_peer_id,
    mode_peer_id,
    peers_of,
    webhook_peer_id,
)
from masd.store import OutboxItem, Tx

#: Cached TypeViews per Runtime, at most (see :meth:`Runtime.type_view`).
MAX_TYPE_VIEWS = 1024


class UnknownCase(MasdError):
    """``type=id@D`` with no such case (LMTP ``550 5.1.1``)."""

    code = "unknown-case"


@dataclass(frozen=True)
class _Loaded:
    """One configuration and what is derived from it, replaced as a whole on reload."""

    config: Config
    directory: Directory
    #: TypeViews already built, per (domain, type) as asked, for this config.
    views: dict[tuple[str, str], TypeView]
    #: The MTAs this config trusts, built once (every mail asks).
    trust: TrustSettings


def _loaded(config: Config) -> _Loaded:
    server = config.server
    trust = TrustSettings.of(server.trusted_authserv_ids, server.trusted_hosts)
    return _Loaded(config, Directory(peers_of(config)), {}, trust)


class Runtime:
    """What the service needs besides the database: config, peers, ids, where statuses go.

    The configuration is a reference every input reads afresh (``rt.config``,
    ``rt.directory``): :meth:`replace_config` swaps it for the next input
    (``masd reload``, ``SIGHUP``) while the edges keep their connections.  One
    input sees one configuration throughout: a :class:`Job` holds the
    runtime :meth:`pinned` at its start.
    """

    def __init__(self, config: Config, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self._loaded = _loaded(config)
        self.status_url = config.server.public_url.rstrip("/") + "/mas/v0.1/messages"

    @property
    def config(self) -> Config:
        return self._loaded.config

    @property
    def directory(self) -> Directory:
        return self._loaded.directory

    def replace_config(self, config: Config) -> None:
        """From the next input on, ``config`` (and its peers) instead of the current one."""
        self._loaded = _loaded(config)
        self.status_url = config.server.public_url.rstrip("/") + "/mas/v0.1/messages"

    def pinned(self) -> Runtime:
        """This runtime with the current configuration, unmoved by later replacements."""
        pinned = Runtime.__new__(Runtime)
        pinned.new_id, pinned._loaded, pinned.status_url = (
            self.new_id,
            self._loaded,
            self.status_url,
        )
        return pinned

    def context(self, now: float) -> Context:
        return Context(now=now, new_id=self.new_id, status_url=self.status_url)

    def type_config(self, domain: str, type_: str) -> TypeConfig:
        typ = self.config.type_for(domain, type_)
        if typ is None:
            raise UnknownCase(f"no type {type_!r} at {domain}")
        return typ

    def type_view(self, domain: str, type_: str) -> TypeView:
        views = self._loaded.views
        view = views.get((domain, type_))
        if view is not None:
            return view
        typ = self.type_config(domain, type_)
        endpoints = {
            mode: EndpointView(mode_peer_id(domain, type_, mode), ep.url, ep.deadline, ep.fields)
            for mode, ep in typ.endpoints.items()
        }
        view = TypeView(
            role="master" if typ.role == "master" else "slave",
            modes=frozenset(typ.modes),
            endpoints=MappingProxyType(endpoints),
            acknowledge=typ.acknowledge,
            require_dmarc_for_handoff=typ.require_dmarc_for_handoff,
            id_prefix=typ.id_prefix,
        )
        # Only configured types get here; the bound keeps odd spellings of
        # their names (the domain and type as asked) from piling up.
        if len(views) < MAX_TYPE_VIEWS:
            views[(domain, type_)] = view
        return view

    def trust(self) -> TrustSettings:
        return self._loaded.trust

    def master_of(self, domain: str, type_: str) -> Peer:
        master = self.type_config(domain, type_).master
        if master is None:
            raise MasdError(f"type {type_} at {domain} has no master", code="not-slave")
        return Peer(master_peer_id(domain, type_), master.url)

    def default_policy(self, domain: str, type_: str) -> PolicyView:
        policy = self.type_config(domain, type_).policy
        return PolicyView(policy.autonomous_send, policy.transfers)

    def transfer(self, domain: str, type_: str, policy: PolicyView) -> Transfer | None:
        """The webhook a policy's transfers URL points at (docs/protocol.md §18), or None."""
        if policy.transfers == "block":
            return None
        hook = webhook_for(self.type_config(domain, type_), policy.transfers)
        if hook is None:
            return None
        return Transfer(webhook_peer_id(domain, type_, hook.url), policy.transfers, hook.fields)

    def slave_terms(self, domain: str, type_: str, policy: PolicyView) -> SlaveTerms:
        """What governs a slave case of ``type_`` at ``domain`` under ``policy``."""
        return SlaveTerms(
            policy,
            self.master_of(domain, type_),
            self.transfer(domain, type_, policy),
            self.type_config(domain, type_).require_dmarc_for_handoff,
        )

    def url_of(self, peer_id: str | None) -> str | None:
        peer = self.directory.by_id.get(peer_id or "")
        return peer.url if peer else None


@dataclass(frozen=True)
class Job:
    """One input being handled: the runtime, the store job's transaction, its time."""

    rt: Runtime
    tx: Tx
    now: float

    def __post_init__(self) -> None:
        # One input, one configuration, even if a reload lands while it runs.
        object.__setattr__(self, "rt", self.rt.pinned())

    def context(self) -> Context:
        return self.rt.context(self.now)


# --------------------------------------------------------------------------- what a job woke


@dataclass(frozen=True)
class Wakes:
    """What a committed store job gave the outbox sender and the deadline timer to do.

    ``outbox``: the job queued at least one outbox row.  ``deadline``: the
    earliest ``handoffs.deadline_at`` it wrote, if any.  The app wakes the
    outbox only for the first and the timer only for a deadline sooner than
    the one it sleeps until, so a plain intake mail or a ``negotiating``
    status costs neither a read.

    How it stays exact under group commit: :func:`masd.service.apply.apply`,
    the one place effects are written, returns what it wrote, and each job's
    top-level function (:func:`~masd.service.deliver`,
    :func:`~masd.service.receive`, :func:`~masd.service.fire_deadline`,
    :func:`~masd.service.outbox_failed`) returns it in the job's result, so
    it reaches the edge only once that job has committed.  Nothing is read
    after a commit from state another job may have changed meanwhile, and a
    job that rolled back wakes nobody.
    """

    outbox: bool = False
    deadline: float | None = None
    #: Queues whose head the job changed without queuing a row (an operator's
    #: retry or drop, :mod:`masd.service.queue_actions`): the outbox looks at them again.
    queues: frozenset[str] = frozenset()
    #: Cases the job erased: a send of theirs still under way is broken off.
    erased: frozenset[str] = frozenset()
    #: The rows the job queued, as the outbox reads them, when each was its queue's head
    #: as the job wrote it: handed to the outbox, which then sends them without reading
    #: them back.  Empty when the job queued none, or any that waits behind another or
    #: was written elsewhere than :func:`masd.service.apply.apply`: the outbox then
    #: looks.  Not part of what a wake is (equal wakes may hand different rows).
    rows: tuple[OutboxItem, ...] = field(default=(), compare=False)

    @property
    def handed(self) -> bool:
        """Every row the job queued is in :attr:`rows` (nothing for the outbox to look for)."""
        return bool(self.rows) or not self.outbox

    def __or__(self, other: Wakes) -> Wakes:
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        handed = self.handed and other.handed
        return Wakes(
            self.outbox or other.outbox,
            min(deadlines) if deadlines else None,
            self.queues | other.queues,
            self.erased | other.erased,
            self.rows + other.rows if handed else (),
        )

    @staticmethod
    def union(wakes: Iterable[Wakes]) -> Wakes:
        out = NO_WAKES
        for w in wakes:
            out = out | w
        return out


NO_WAKES: Final = Wakes()
#: A commit whose effect nobody described (and the test clock): wake both.
ALL_WAKES: Final = Wakes(outbox=True, deadline=float("-inf"))


class CommitListener(Protocol):
    """Told, on the event loop, what each committed store job gave to do.

    Each edge tells its listener (the app's wakes the outbox and the timer)
    the :class:`Wakes` of every store job of its once that job has committed;
    :data:`ALL_WAKES` when the test clock moved and anything may be due.
    """

    def committed(self, wakes: Wakes) -> None:
        """A store job committed, having written ``wakes``."""


class NoListener:
    """A :class:`CommitListener` for an edge whose commits wake nobody."""

    def committed(self, wakes: Wakes) -> None:
        del wakes  # nothing listens
