"""The bytes of a recorded message and of its attachments, a piece at a time
(docs/protocol.md §16.8).

The raw message is read from the store in pieces of :data:`CHUNK` bytes
(:func:`masd.store.message_reads.raw_range`), each its own read job, so serving a large
message holds one piece at a time.  An attachment is first located
(:func:`masd.core.partspans.attachment_spans`, on the raw bytes read once) and its
decoded bytes checked against the event's ``sha256`` and ``size``; the span found is
kept (:class:`Spans`), and then served as the raw message is, through its
transfer encoding's decoder (:mod:`masd.core.partdecode`, uuencode included), a range by
decoding from the start and skipping what comes before it.  A file inside a TNEF part is
no such span: it is decoded whole from its part's encoded bytes in memory, bounded by the
size of the message, by at most :data:`WHOLE_AT_ONCE` requests at a time.  Requests for an
attachment whose span is not kept yet wait for one finding of it (:meth:`Spans.find`),
so many at once read the message once, not once each.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from masd.core.partdecode import decoder_for
from masd.core.partspans import PartSpan, attachment_spans, span_bytes, streamed
from masd.store import StoreHandle, Tx
from masd.store import message_reads as reads

#: Raw bytes read from the store at a time.
CHUNK: Final = 256 * 1024
#: The pieces an attachment's first bytes are read in, for a range that ends near its start.
SMALL_CHUNK: Final = 16 * 1024
#: Attachments whose span :class:`Spans` keeps.
KEPT_SPANS: Final = 256
#: Requests that decode an attachment whole in memory at once; the others wait their turn.
WHOLE_AT_ONCE: Final = 2


class Mismatch(Exception):
    """The bytes found for an attachment are not those its event lists (a fault of masd's)."""


class Gone(Exception):
    """The message is no longer in the store (its case was erased while it was served)."""


@dataclass(frozen=True)
class Attachment:
    """An attachment as listed, and where its encoded bytes lie in the raw message."""

    content_type: str
    filename: str | None
    size: int
    sha256: str
    span: PartSpan


def _decoded_digest(raw: bytes, span: PartSpan) -> tuple[int, str]:
    if not span.streamable:
        data = span_bytes(raw[span.start : span.end], span)
        return len(data), hashlib.sha256(data).hexdigest()
    decoder = decoder_for(span.encoding)
    digest = hashlib.sha256()
    size = 0
    view = memoryview(raw)
    for at in range(span.start, span.end, CHUNK):
        piece = decoder.feed(bytes(view[at : min(at + CHUNK, span.end)]))
        digest.update(piece)
        size += len(piece)
    tail = decoder.end()
    digest.update(tail)
    return size + len(tail), digest.hexdigest()


def locate(tx: Tx, message_ref: str, index: int, listed: Mapping[str, Any]) -> PartSpan:
    """The span of attachment ``index`` of ``message_ref``, its decoded bytes checked
    against ``listed`` (the event's entry); :class:`Mismatch` when they differ."""
    raw = reads.raw_whole(tx, message_ref)
    if raw is None:
        raise Mismatch(f"message {message_ref} has no raw bytes")
    spans = attachment_spans(raw)
    if index >= len(spans):
        raise Mismatch(f"message {message_ref}: attachment {index} not found in the raw bytes")
    span = streamed(raw, spans[index])
    size, sha256 = _decoded_digest(raw, span)
    if (size, sha256) != (listed.get("size"), listed.get("sha256")):
        raise Mismatch(
            f"message {message_ref}: attachment {index} decodes to {size} bytes "
            f"sha256 {sha256}, not those of the event"
        )
    return span


#: An attachment's key in :class:`Spans`: its message, its index, the message's sha256.
SpanKey = tuple[str, int, str]


class Spans:
    """The spans of the attachments served lately, so a range does not locate again."""

    def __init__(self, keep: int = KEPT_SPANS) -> None:
        self._kept: OrderedDict[SpanKey, PartSpan] = OrderedDict()
        self._keep = keep
        self._finding: dict[SpanKey, asyncio.Task[PartSpan]] = {}

    async def find(self, key: SpanKey, locate: Callable[[], Awaitable[PartSpan]]) -> PartSpan:
        """The span kept for ``key``, or the one ``locate`` finds; requests that ask while it
        is being found wait for that one finding (what it raises, they raise)."""
        span = self.get(key)
        if span is not None:
            return span
        finding = self._finding.get(key)
        if finding is None:
            finding = asyncio.ensure_future(locate())
            self._finding[key] = finding
            finding.add_done_callback(functools.partial(self._found, key))
        # shielded: a client that leaves does not cancel the finding the others wait for
        return await asyncio.shield(finding)

    def _found(self, key: SpanKey, finding: asyncio.Task[PartSpan]) -> None:
        self._finding.pop(key, None)
        if not finding.cancelled() and finding.exception() is None:
            self.put(key, finding.result())

    def get(self, key: SpanKey) -> PartSpan | None:
        span = self._kept.get(key)
        if span is not None:
            self._kept.move_to_end(key)
        return span

    def put(self, key: SpanKey, span: PartSpan) -> None:
        self._kept[key] = span
        while len(self._kept) > self._keep:
            self._kept.popitem(last=False)


class _PerLoop:
    """A semaphore of ``n`` for the running event loop (one made for each loop)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._made: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._made is None or self._made[0] is not loop:
            self._made = (loop, asyncio.Semaphore(self._n))
        return self._made[1]


_WHOLE: Final = _PerLoop(WHOLE_AT_ONCE)


async def raw_pieces(
    store: StoreHandle, message_ref: str, start: int, end: int, chunk: int = CHUNK
) -> AsyncIterator[bytes]:
    """``raw[start:end]`` of the message, ``chunk`` bytes at a time."""
    at = start
    while at < end:
        count = min(chunk, end - at)
        job = functools.partial(reads.raw_range, message_ref=message_ref, offset=at, length=count)
        piece = await store.read(job)
        if piece is None:
            raise Gone(f"message {message_ref} is no longer stored (its case was erased)")
        if not piece:
            return
        yield piece
        at += len(piece)


async def decoded_pieces(
    store: StoreHandle, message_ref: str, span: PartSpan, first: int, last: int
) -> AsyncIterator[bytes]:
    """Bytes ``first`` to ``last`` (inclusive) of the attachment at ``span``, decoded."""
    if not span.streamable:
        async with _WHOLE.get():
            got = [p async for p in raw_pieces(store, message_ref, span.start, span.end)]
            out = span_bytes(b"".join(got), span)[first : last + 1]
            del got
        if out:
            yield out
        return
    decoder = decoder_for(span.encoding)
    at = 0  # decoded bytes before the current piece

    def wanted(piece: bytes) -> bytes:
        lo, hi = max(first - at, 0), min(last + 1 - at, len(piece))
        return piece[lo:hi] if lo < hi else b""

    # A few bytes near the start (a client sniffing the type) read little: no encoding
    # takes more than 4 characters a byte, but quoted-printable's =XX and line breaks.
    chunk = min(CHUNK, max(SMALL_CHUNK, 4 * (last + 1)))
    async for encoded in raw_pieces(store, message_ref, span.start, span.end, chunk):
        piece = decoder.feed(encoded)
        if out := wanted(piece):
            yield out
        at += len(piece)
        if at > last:
            return
    if out := wanted(decoder.end()):
        yield out
