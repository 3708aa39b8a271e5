"""Who may read what (docs/protocol.md §16.10): the one rule every read route goes by.

The admin secret reads everything.  The outside master of a slave-role type reads, with
its own secret, what belongs to the (domain, type) pairs it is the master of: their
messages, cases, threads, events and intakes, pending ones included.  Mode endpoints and
webhooks read nothing.  :func:`entitled` decides; the HTTP edge asks it once for the
route (before the handler, with :data:`ANYTHING`) and once for each thing a handler is
about to show (an :class:`Owned`), and lists (cases, events, intakes) are read through
:attr:`Reader.scope`, so a master's lists hold its own types only.

What a reader may not see it is told does not exist: the same refusal, word for word,
as for a thing never made.  A master-role type's ids are sequential, so a refusal of its
own would let any master count another type's cases.

An event belongs to the (domain, type) its case key names (:func:`key_owner`), not to a
row of the case: a ``case.erased`` entry outlives its case, and the feed's store reads
and its in-memory tail go by the key alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Reader:
    """A caller of the read side: ``pairs`` None for the admin (everything), else the
    (domain, type) pairs of the slave-role types whose master it is."""

    name: str
    pairs: frozenset[tuple[str, str]] | None

    @classmethod
    def master_of(cls, name: str, pairs: Iterable[tuple[str, str]]) -> Reader:
        return cls(name, frozenset(pairs))

    @property
    def scope(self) -> list[str] | None:
        """The pairs as ``"domain/type"`` (the store's scope); None: no limit."""
        if self.pairs is None:
            return None
        return sorted(f"{domain}/{type_}" for domain, type_ in self.pairs)


#: The admin.
ADMIN: Final = Reader("admin", None)


@dataclass(frozen=True)
class Owned:
    """One thing read (a case, its thread, a message, an intake): its domain and type."""

    domain: str
    type: str


def key_owner(case_key: str) -> Owned:
    """The domain and type a case key (``type=id@domain``) names."""
    local, _, domain = case_key.rpartition("@")
    return Owned(domain, local.partition("=")[0])


#: The read side as a whole: what a route asks before it knows what it will show.
ANYTHING: Final = Owned("", "")


def entitled(reader: Reader | None, what: Owned) -> bool:
    """Whether ``reader`` may read ``what``.  ``reader`` None: a peer that reads
    nothing (a mode endpoint, a webhook)."""
    if reader is None:
        return False
    if reader.pairs is None or what is ANYTHING:
        return True
    return (what.domain, what.type) in reader.pairs
