"""Where the outbox sender finds queue heads to send, without scanning every due row.

A peer that takes nothing (hung, failing, or simply at its in-flight limit
with a backlog) may leave thousands of due heads in the outbox.  Asking the
store each time for "every due head but those" would read them all on every
look.  Instead each look asks only for what can have changed since the last
one (all of it in one read, :func:`look`):

1. rows added since: the rows after the last id looked at (a page at a time);
2. heads whose backoff ran out since the last look: a window of
   ``next_attempt_at``, continued from where the last look stopped;
3. the new head of each queue whose send ended (its next row, or the same
   row again when it is retried later);
4. for each lane that turned heads away and has room again, its next heads
   by id from the first one it turned away (:attr:`HeadFinder.waiting`);
5. when the next pending row falls due.

A head seen once and turned away is found again by (4); a head that was not
yet due is found by (2) when it falls due; a row behind a head by (3) when the
head's send ends.  Rows a look returns whose queue was in flight when it was
asked are dropped: that send may have ended while the store was read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from masd import service
from masd.service import OutboxItem
from masd.store import Tx

#: Rows per page of new rows, and heads per window of rows falling due.
PAGE: Final = 256
_LAST_ID: Final = 2**63 - 1


@dataclass(frozen=True)
class Fill:
    """Ask for up to ``room`` heads of ``lane`` (its ``peers``), by id from ``from_id``."""

    lane: str
    peers: frozenset[str]
    from_id: int
    room: int


@dataclass(frozen=True)
class Ask:
    """What one look asks of the store (taken on the loop, read in a store thread)."""

    now: float
    after_id: int | None  # None: the first look (start at the first pending row)
    due_since: tuple[float, int] | None  # (next_attempt_at, id) already looked at
    ended: frozenset[str]
    fills: tuple[Fill, ...]
    busy: frozenset[str]


@dataclass(frozen=True)
class Found:
    items: list[OutboxItem]  # candidates, each once, oldest id first, none of ``busy``
    after_id: int
    due_since: tuple[float, int]
    more: bool  # a page or a window was full: look again at once
    filled: dict[str, tuple[int, int]]  # lane -> (heads found for it, the last one's id)
    next_at: float | None


def look(db: Tx, ask: Ask) -> Found:
    """One look (a store read job): see the module docstring."""
    now = ask.now
    after = service.outbox_start_id(db) if ask.after_id is None else ask.after_id
    new, last, more = service.outbox_after(db, after, now, PAGE)
    if ask.due_since is None:  # the first look: what is due now is among the rows after ``after``
        due: list[OutboxItem] = []
        since = (now, _LAST_ID)
    else:
        due = service.outbox_fell_due(db, ask.due_since, now, PAGE)
        full = len(due) >= PAGE
        since = (due[-1].next_attempt_at, due[-1].id) if full else (now, _LAST_ID)
        more = more or full
    ended = service.outbox_heads(db, ask.ended, now) if ask.ended else []
    filled: dict[str, tuple[int, int]] = {}
    fills: list[OutboxItem] = []
    for f in ask.fills:
        heads = service.outbox_peer_heads(db, f.peers, f.from_id, now, ask.busy, f.room)
        filled[f.lane] = (len(heads), heads[-1].id if heads else f.from_id)
        fills += heads
    seen: dict[int, OutboxItem] = {}
    for item in [*fills, *ended, *due, *new]:
        if item.queue not in ask.busy:
            seen.setdefault(item.id, item)
    items = sorted(seen.values(), key=lambda i: i.id)
    return Found(items, last, since, more, filled, service.next_outbox_at(db, now))


@dataclass
class HeadFinder:
    """The cursors of the looks, the queues whose send ended, the lanes with heads waiting,
    the rows handed with the wakes (:meth:`hand`), and whether the store must be looked at."""

    after_id: int | None = None
    due_since: tuple[float, int] | None = None
    ended: set[str] = field(default_factory=set)
    #: lane -> the lowest id from which it may have due heads it turned away
    waiting: dict[str, int] = field(default_factory=dict)
    #: lane -> the peer ids whose rows were seen in it
    peers: dict[str, set[str]] = field(default_factory=dict)
    #: rows handed with a wake and not yet started (id -> row): each its queue's head
    handed: dict[int, OutboxItem] = field(default_factory=dict)
    #: wakes that came without their rows so far (:meth:`unhanded`)
    bare: int = 0
    #: ``bare`` as the last look was asked
    bare_asked: int = -1
    #: what the last look found: a page was full, the next row falling due, when
    more: bool = False
    next_at: float | None = None
    looked_at: float = float("-inf")
    #: the highest id a look found to send (a row handed later may have been sent)
    found_up_to: int = 0
    #: ids handed beyond ``after_id`` + 1, to move the cursor past once it reaches them
    ahead: set[int] = field(default_factory=set)
    #: mails sent whose queue had no other row pending as their outcome was written
    #: (id -> ``bare`` before that write)
    alone: dict[int, int] = field(default_factory=dict)

    def hand(self, rows: Iterable[OutboxItem]) -> None:
        """Rows a commit queued, each its queue's head: started without a look, and
        the cursor of new rows moved past them (as a look would have)."""
        for row in rows:
            if row.id <= max(self.after_id or 0, self.found_up_to):
                self.unhanded()  # a look may have found it: the next one says
                continue
            self.handed[row.id] = row
            self.ahead.add(row.id)
        self._advance()

    def _advance(self) -> None:
        self.ahead = {i for i in self.ahead if self.after_id is None or i > self.after_id}
        while self.after_id is not None and self.after_id + 1 in self.ahead:
            self.after_id += 1
            self.ahead.discard(self.after_id)

    def unhanded(self) -> None:
        """A wake without its rows (or with queues to look at): the next turn looks."""
        self.bare += 1

    def startable(self, busy: frozenset[str]) -> list[OutboxItem]:
        """The handed rows whose queue has no send under way, oldest first (the others
        wait behind it: each is taken off :attr:`handed` once it is started)."""
        return sorted((r for r in self.handed.values() if r.queue not in busy), key=_by_id)

    def must_look(self, now: float, rooms: Mapping[str, int], every: float) -> bool:
        """Whether this turn reads the store; ``every``: seconds between looks at most."""
        return (
            self.after_id is None  # the first look: rows left pending from before
            or self.bare != self.bare_asked
            or bool(self.ended)
            or self.more
            or (self.next_at is not None and self.next_at <= now)
            or any(rooms.get(lane, 0) > 0 for lane in self.waiting)
            or now >= self.looked_at + every
        )

    def ask(self, now: float, busy: frozenset[str], rooms: dict[str, int]) -> Ask:
        """A look at ``now``; ``rooms``: lanes that admit sends now, and how many."""
        fills = tuple(
            Fill(lane, frozenset(self.peers.get(lane, ())), from_id, rooms[lane])
            for lane, from_id in sorted(self.waiting.items())
            if rooms.get(lane, 0) > 0
        )
        self.bare_asked = self.bare
        return Ask(now, self.after_id, self.due_since, frozenset(self.ended), fills, busy)

    def update(self, ask: Ask, found: Found) -> None:
        """Move the cursors past what ``found`` covered (before its items are started)."""
        # Rows handed while the store was read may have moved the cursor further.
        self.after_id = max(found.after_id, self.after_id or 0)
        self._advance()
        self.due_since = found.due_since
        self.ended -= ask.ended
        self.more, self.next_at, self.looked_at = found.more, found.next_at, ask.now
        self.found_up_to = max([self.found_up_to, *(i.id for i in found.items)])
        for f in ask.fills:
            count, last = found.filled.get(f.lane, (0, f.from_id))
            if count < f.room:
                self.waiting.pop(f.lane, None)  # every head it had waiting was found
            else:
                self.waiting[f.lane] = last + 1

    def send_ended(self, item: OutboxItem) -> None:
        """``item``'s send ended: its queue's next head is looked for, unless none of its
        queue was pending as its outcome was written and every wake since came with its
        rows (a row queued after that was handed, as its queue's head)."""
        if self.alone.pop(item.id, None) != self.bare:
            self.ended.add(item.queue)

    def seen(self, lane: str, item: OutboxItem) -> None:
        """``item`` is offered to ``lane``: started, or :meth:`turned_away` and looked for
        again; either way no longer a handed row waiting for its turn."""
        self.handed.pop(item.id, None)
        self.peers.setdefault(lane, set()).add(item.peer or "")

    def forget(self, case_keys: frozenset[str]) -> None:
        """The handed rows of these cases are gone with them (erased)."""
        self.handed = {i: r for i, r in self.handed.items() if r.case_key not in case_keys}

    def turned_away(self, lane: str, item: OutboxItem) -> None:
        """``lane`` could not take ``item`` now: look for it again when the lane has room."""
        self.waiting[lane] = min(self.waiting.get(lane, _LAST_ID), item.id)


def _by_id(item: OutboxItem) -> int:
    return item.id
