"""The event feed: every thread entry of every case, in commit order (docs/protocol.md §16.5).

An event is one thread entry with its case's address and key and a cursor.
The cursor is ``e`` and the entry's ``pos`` (:mod:`masd.store.entries`): the
place it took in commit order across all cases.  One writer commits whole
batches, so a reader that sees an entry also sees every entry before it;
a client that resumes after the last cursor it saw therefore misses nothing
and sees nothing twice, across restarts of masd and of the client alike.

:class:`FeedWatch` lets a reader wait for the next commit instead of
polling: the app pokes it after each committed store job (every edge tells
the app's commit listener), and a waiter also looks again every
:data:`POLL_SECONDS`, so a commit nobody announced (another process writing
the store) is seen too.  Its one waiter is the feed's hub
(:mod:`masd.read.feed_hub`), which reads and encodes each commit's events
once (:func:`encoded`) for every follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

from masd.read.case_views import row_json
from masd.store import StoreHandle, Tx
from masd.store.entries import EntryRow, events, last_events, last_pos
from masd.store.message_reads import scoped_events

#: ``limit`` of a page of events: default and largest.
DEFAULT_EVENTS: Final = 100
MAX_EVENTS: Final = 1000
#: The longest ``wait`` of a long poll, in seconds (docs/protocol.md §16).
MAX_WAIT: Final = 60
#: How often a waiter looks again without being told of a commit.
POLL_SECONDS: Final = 1.0
#: The shortest time between two reads of one follower: many commits in a row
#: cost a follower one read, not one each.
MIN_GAP_SECONDS: Final = 0.05

_PREFIX: Final = "e"


def cursor(pos: int) -> str:
    """The cursor of the entry at ``pos`` (an opaque string to clients)."""
    return f"{_PREFIX}{pos}"


#: The cursor before the first event.
START: Final = cursor(0)


def parse_cursor(text: str) -> int | None:
    """The ``pos`` of a cursor masd gave, or None when ``text`` is not one."""
    digits = text[len(_PREFIX) :]
    ok = text.startswith(_PREFIX) and digits.isascii() and digits.isdigit()
    return int(digits) if ok and len(digits) <= 18 else None


def event_json(row: EntryRow) -> dict[str, Any]:
    """``{"cursor", "case": {"address", "key"}, "entry": {...}}``."""
    return {
        "cursor": cursor(row.pos),
        "case": {"address": row.address, "key": row.case_key},
        "entry": row_json(row),
    }


@dataclass(frozen=True)
class Encoded:
    """One event encoded once, for every follower: its JSON and its SSE frame."""

    pos: int
    case_key: str
    json: bytes
    sse: bytes


def encode(row: EntryRow) -> Encoded:
    """The event of ``row`` as JSON and as a Server-Sent Event (``id``, ``event``, ``data``)."""
    event = event_json(row)
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    head = f"id: {event['cursor']}\nevent: {row.kind}\ndata: ".encode()
    return Encoded(row.pos, row.case_key, data, head + data + b"\n\n")


@dataclass(frozen=True)
class Encodings:
    """Events after a ``pos``, encoded, and how far the store was looked at: ``upto``
    is the last event's ``pos`` for a full page, else the store's latest (a page
    of one case that found nothing more has still looked that far)."""

    items: list[Encoded]
    upto: int
    ahead: bool = False


def encoded(
    tx: Tx,
    after: int,
    limit: int,
    case_key: str | None = None,
    scope: Collection[str] | None = None,
) -> Encodings:
    """Up to ``limit`` events after ``after`` (of ``scope``'s ``"domain/type"`` pairs
    only, if given), encoded (in the read's thread)."""
    if scope is None:
        rows = events(tx, after, max(1, limit), case_key)
    else:
        rows = scoped_events(tx, after, max(1, limit), case_key, sorted(scope))
    items = [encode(r) for r in rows]
    if len(rows) >= limit:
        return Encodings(items, rows[-1].pos)
    latest_pos = last_pos(tx)
    return Encodings(items, max(latest_pos, after), ahead=not rows and after > latest_pos)


def body(items: list[Encoded], after: int) -> bytes:
    """``{"events": [...], "next": CURSOR}`` of encoded events (``next``: ``after``'s
    cursor when there are none)."""
    nxt = cursor(items[-1].pos if items else after)
    return b'{"events":[' + b",".join(i.json for i in items) + f'],"next":"{nxt}"}}'.encode()


@dataclass(frozen=True)
class Page:
    """A page of the feed: its events, the cursor to go on from, and whether
    the cursor asked for lies past the store's latest entry."""

    events: list[dict[str, Any]]
    next: str
    ahead: bool = False

    def json(self) -> dict[str, Any]:
        return {"events": self.events, "next": self.next}


def page(
    tx: Tx,
    after: int,
    limit: int = DEFAULT_EVENTS,
    case_key: str | None = None,
    scope: Sequence[str] | None = None,
) -> Page:
    """The events after ``pos`` ``after`` (of one case if ``case_key``; of the cases of
    ``scope``'s ``"domain/type"`` pairs only, if given), at most ``limit``.

    ``ahead``: nothing follows ``after`` and the store's latest entry comes
    before it, so the cursor came from another store (one this was restored
    over from a backup, say): resuming there would skip what comes next.
    """
    if scope is None:
        rows = events(tx, after, max(1, limit), case_key)
    else:
        rows = scoped_events(tx, after, max(1, limit), case_key, scope)
    if rows:
        return Page([event_json(r) for r in rows], cursor(rows[-1].pos))
    return Page([], cursor(after), ahead=after > last_pos(tx))


def latest(tx: Tx, count: int, case_key: str | None = None) -> Page:
    """The latest ``count`` events (``masd tail``), oldest first."""
    rows = last_events(tx, max(1, count), case_key)
    next_pos = rows[-1].pos if rows else last_pos(tx)
    return Page([event_json(r) for r in rows], cursor(next_pos))


class FeedWatch:
    """Tells waiting readers that a store job may have added entries.

    Take a :meth:`mark` before reading; :meth:`wait` with it returns at once
    when a poke came since, so a commit between the read and the wait is
    never slept through.
    """

    def __init__(self) -> None:
        self._generation = 0
        self._event = asyncio.Event()
        self.closed = False

    def poke(self) -> None:
        """A store job committed (called on the event loop)."""
        self._generation += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    def committed(self, wakes: object) -> None:
        """As a commit listener: any commit may have added entries."""
        del wakes
        self.poke()

    def close(self) -> None:
        """masd is stopping: every waiter returns, and followers end."""
        self.closed = True
        self.poke()

    def mark(self) -> int:
        return self._generation

    async def wait(self, mark: int, timeout: float) -> None:
        """Until a poke after ``mark``, or ``timeout`` (at most :data:`POLL_SECONDS`)."""
        if self.closed or mark != self._generation or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), min(timeout, POLL_SECONDS))


async def follow(
    store: StoreHandle,
    watch: FeedWatch,
    after: int,
    *,
    limit: int = DEFAULT_EVENTS,
    case_key: str | None = None,
    wait: float = 0.0,
    scope: Sequence[str] | None = None,
) -> Page:
    """The next page after ``after``; with ``wait`` (seconds), held until it
    has an event, the time is up, or masd stops."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    while True:
        mark = watch.mark()
        found = await store.read(lambda tx: page(tx, after, limit, case_key, scope))
        left = until - loop.time()
        if found.events or found.ahead or watch.closed or left <= 0:
            return found
        await watch.wait(mark, left)


async def stream(
    store: StoreHandle,
    watch: FeedWatch,
    after: int,
    *,
    case_key: str | None = None,
    idle: float = 15.0,
    scope: Sequence[str] | None = None,
) -> AsyncIterator[Page]:
    """Pages after ``after`` as they commit, until masd stops; an empty page
    (nothing new) after ``idle`` seconds of silence, for a keep-alive.

    One reader's own loop (the operator console's live view, a few sessions);
    the HTTP feed's followers share :class:`masd.read.feed_hub.FeedHub` instead.
    """
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while not watch.closed:
        mark = watch.mark()
        found = await store.read(
            functools.partial(page, after=after, limit=MAX_EVENTS, case_key=case_key, scope=scope)
        )
        if found.ahead:
            yield found
            return
        if found.events:
            after = parse_cursor(found.next) or after
            quiet_since = loop.time()
            yield found
            if len(found.events) >= MAX_EVENTS:
                continue  # a backlog: the next page at once
        elif loop.time() - quiet_since >= idle:
            quiet_since = loop.time()
            yield found
        await watch.wait(mark, quiet_since + idle - loop.time())
        await asyncio.sleep(MIN_GAP_SECONDS)
