"""The feed's hub: each commit's events read and encoded once, for every follower.

A *follower* is an SSE stream or a held long poll of ``GET /mas/v0.1/events``
(docs/protocol.md §16.5).  While there is one, the hub runs one loop: after
each commit (told by :class:`~masd.read.feed.FeedWatch`, or every
:data:`~masd.read.feed.POLL_SECONDS` for a commit of another process) it
reads the new events in one store read, encodes each once
(:func:`~masd.read.feed.encoded`), and keeps them in its *tail*: the latest
events, at most :data:`TAIL_BYTES` of them.  A follower whose position lies
in the tail takes what follows it from there: no read and no encoding of its
own, so 500 followers cost about what one does.

A follower further back (a replay, a cursor older than the tail) reads the
store a page of :data:`REPLAY_PAGE` events at a time, one such read at once
across all followers (:meth:`FeedHub.catch_up`), each page written and
drained before the next is read: a replay of the whole store holds one page.

A follower that does not read falls behind the tail: once more than
:data:`TAIL_BYTES` of events wait for it (its unsent backlog), the tail lets
them go and the follower is dropped (its connection closed); it may resume
from the last cursor it saw.  ``server.max_followers`` bounds how many there
are at once (:class:`FollowersFull`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from masd.read.access import ADMIN, Reader, entitled, key_owner
from masd.read.feed import MAX_EVENTS, MIN_GAP_SECONDS, POLL_SECONDS, Encoded, Encodings, FeedWatch
from masd.read.feed import encoded as _encoded
from masd.store import StoreError, StoreHandle
from masd.store.entries import last_pos

log = logging.getLogger("masd.feed")

#: The bound of a follower's unsent backlog (and of the tail that holds it), in bytes.
TAIL_BYTES: Final = 4 * 1024 * 1024
#: Events per store read of a follower that is further back than the tail.
REPLAY_PAGE: Final = 200
#: Hand-overs to followers a second, at most: with many followers the hub reads less
#: often (and each follower gets more events at once), so fanning out costs intake
#: about the same however many follow; 500 followers hear of a commit within 0.25 s.
FANOUT_PER_SECOND: Final = 2000


class FollowersFull(Exception):
    """``server.max_followers`` followers already."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"{cap} followers of the event feed already (server.max_followers)")
        self.cap = cap


class Dropped(Exception):
    """The follower was dropped (it fell more than :data:`TAIL_BYTES` behind)."""


@dataclass(eq=False)
class Follower:
    """One follower: ``pos`` is how far it has been given (or looked at) the feed."""

    pos: int
    case_key: str | None = None
    #: Who follows: the events it is given are those it may read, by the one rule of
    #: :func:`masd.read.access.entitled` (the store's reads go by its scope, the same rule).
    reader: Reader = ADMIN
    live: bool = False
    dropped: str | None = None
    on_drop: Callable[[], None] | None = None

    @property
    def takes_all(self) -> bool:
        """Whether every event is this follower's (no case and no scope named)."""
        return self.case_key is None and self.reader.pairs is None

    def wants(self, item: Encoded) -> bool:
        if self.case_key is not None and item.case_key != self.case_key:
            return False
        return entitled(self.reader, key_owner(item.case_key))

    def drop(self, why: str) -> None:
        if self.dropped is None:
            self.dropped = why
            if self.on_drop is not None:
                self.on_drop()


class FeedHub:
    """The one reader of new events for every follower (see the module's doc)."""

    def __init__(
        self,
        store: StoreHandle,
        watch: FeedWatch,
        *,
        tail_bytes: int = TAIL_BYTES,
        gap: float = MIN_GAP_SECONDS,
    ) -> None:
        self._store = store
        self.watch = watch
        self.tail_bytes = tail_bytes
        self._gap = gap
        self._followers: set[Follower] = set()
        self._task: asyncio.Task[None] | None = None
        self._pos: list[int] = []
        self._items: list[Encoded] = []
        self._bytes = 0
        #: The tail holds the events with ``base < pos <= head`` (once ``started``).
        self.base = 0
        self.head = 0
        self.started = False
        #: The SSE bytes of the latest read's events, and the ``head`` before them.
        self._batch: tuple[int, bytes] = (0, b"")
        #: Erased cases (key: the position of its case.erased entry) whose older events
        #: a read begun before the erase may still bring: they are left out.
        self._erased: dict[str, int] = {}
        self._news = asyncio.Event()
        self._replay = asyncio.Lock()
        self.reads = 0  # store reads of new events (the hub's own)

    @property
    def count(self) -> int:
        """Followers now."""
        return len(self._followers)

    @contextlib.contextmanager
    def joined(self, follower: Follower, cap: int) -> Iterator[Follower]:
        """``follower`` counted while the block runs; :class:`FollowersFull` beyond ``cap``."""
        if len(self._followers) >= cap:
            raise FollowersFull(cap)
        self._followers.add(follower)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            yield follower
        finally:
            self._followers.discard(follower)

    def covers(self, pos: int) -> bool:
        """The tail holds whatever follows ``pos`` (or will, once the hub reads it)."""
        return self.started and self.base <= pos

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        try:
            while self._followers and not self.watch.closed:
                mark = self.watch.mark()
                full = False
                try:
                    full = await self._refill()
                except StoreError as exc:
                    log.warning("feed: reading new events failed: %s", exc.detail)
                    await asyncio.sleep(POLL_SECONDS)
                if not full:
                    await self.watch.wait(mark, POLL_SECONDS)
                    await asyncio.sleep(max(self._gap, len(self._followers) / FANOUT_PER_SECOND))
        finally:
            self._task = None
            self.started = False
            self._pos, self._items, self._bytes = [], [], 0
            self._batch = (0, b"")
            self._publish()

    async def _refill(self) -> bool:
        """Read and encode what committed since ``head``; whether a full page came."""
        if not self.started:
            self.base = self.head = await self._store.read(last_pos)
            self.started = True
            self._publish()
        self.reads += 1
        found = await self._store.read(
            functools.partial(_encoded, after=self.head, limit=MAX_EVENTS)
        )
        if found.items:
            self._append(found.items)
        return len(found.items) >= MAX_EVENTS

    def forget(self, case_key: str, upto: int) -> None:
        """Case ``case_key`` was erased, its ``case.erased`` entry at ``upto``: the
        tail lets go of the case's events before it, and leaves out any a read
        still brings."""
        self._erased[case_key] = upto
        kept = [i for i in self._items if not self._gone(i)]
        if len(kept) == len(self._items):
            return
        self._items, self._pos = kept, [i.pos for i in kept]
        self._bytes = sum(len(i.sse) for i in kept)
        self._batch = (self.head, b"")  # followers take what is left one by one

    def _gone(self, item: Encoded) -> bool:
        upto = self._erased.get(item.case_key)
        return upto is not None and item.pos < upto

    def _append(self, items: list[Encoded]) -> None:
        before, head = self.head, items[-1].pos
        if self._erased:
            items = [i for i in items if not self._gone(i)]
            self._erased = {k: p for k, p in self._erased.items() if p > head}
        if not items:
            self.head = head
            self._batch = (head, b"")
            self._publish()
            return
        for item in items:
            self._pos.append(item.pos)
            self._items.append(item)
            self._bytes += len(item.sse)
        self.head = head
        self._batch = (before, b"".join(i.sse for i in items))
        self._trim(keep=len(items))
        self._publish()

    def _trim(self, keep: int) -> None:
        """Let the oldest events go past :attr:`tail_bytes` (keeping the latest read's);
        a follower they were still waiting for is dropped."""
        cut, size = 0, self._bytes
        while size > self.tail_bytes and cut < len(self._items) - keep:
            size -= len(self._items[cut].sse)
            cut += 1
        if not cut:
            return
        self.base = self._pos[cut - 1]
        del self._pos[:cut], self._items[:cut]
        self._bytes = size
        for follower in list(self._followers):
            if follower.live and follower.pos < self.base:
                log.info("feed: follower dropped, more than %d bytes unsent", self.tail_bytes)
                follower.drop(f"more than {self.tail_bytes} bytes of events unsent")

    def _publish(self) -> None:
        news, self._news = self._news, asyncio.Event()
        news.set()

    # ------------------------------------------------------------------ for followers

    async def catch_up(
        self, follower: Follower, limit: int, *, first: bool = False
    ) -> Encodings | None:
        """Events after ``follower.pos`` from the store, or None when the tail holds
        them (``first``: a cursor past the hub's ``head`` is looked up in the store,
        which tells whether it lies past the store's latest event).

        One such read at once across every follower, and the reads of replays
        take at most half the time: intake goes first.
        """
        if self.covers(follower.pos) and (follower.pos <= self.head or not first):
            return None
        loop = asyncio.get_running_loop()
        async with self._replay:
            began = loop.time()
            found = await self._store.read(
                functools.partial(
                    _encoded,
                    after=follower.pos,
                    limit=limit,
                    case_key=follower.case_key,
                    scope=follower.reader.scope,
                )
            )
            if len(found.items) >= limit:
                await asyncio.sleep(min(loop.time() - began, POLL_SECONDS))
        return found

    def _after(self, follower: Follower, limit: int) -> list[Encoded]:
        start = bisect.bisect_right(self._pos, follower.pos)
        found: list[Encoded] = []
        for item in self._items[start:]:
            if len(found) >= limit:
                break
            if follower.wants(item):
                found.append(item)
            follower.pos = item.pos
        return found

    async def _news_until(self, until: float) -> bool:
        """Wait for the next read of the hub until loop time ``until``; False when it is up."""
        loop = asyncio.get_running_loop()
        if until <= loop.time():
            return False
        news = self._news
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until):
                await news.wait()
        return True

    async def wait_items(
        self, follower: Follower, limit: int, until: float
    ) -> list[Encoded] | None:
        """Events after ``follower.pos`` from the tail, waiting until loop time ``until``
        for one; ``[]`` when the time is up or masd stops, None when the tail no longer
        holds what follows ``follower.pos`` (read the store: :meth:`catch_up`)."""
        while not self.watch.closed:
            if self.started and not self.covers(follower.pos):
                return None
            if self.started and self.head > follower.pos:
                found = self._after(follower, limit)
                if found:
                    return found
            if not await self._news_until(until):
                break
        return []

    async def next_sse(self, follower: Follower, until: float) -> bytes | None:
        """The SSE bytes of what follows a live follower, waiting until ``until``;
        ``b""`` when nothing came, None when masd stops.  :class:`Dropped` if it was."""
        while not self.watch.closed:
            if follower.dropped is not None:
                raise Dropped(follower.dropped)
            if self.started and self.head > follower.pos:
                before, data = self._batch
                if follower.takes_all and before == follower.pos:
                    follower.pos = self.head
                    return data
                found = self._after(follower, MAX_EVENTS)
                if found:
                    return b"".join(i.sse for i in found)
            if not await self._news_until(until):
                return b""
        return None
