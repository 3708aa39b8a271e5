"""Where each attachment of a message lies in its raw bytes, without copying them.

:func:`attachment_spans` is the one place the bytes behind ``event.attachments[n]`` are
found: for each listed attachment, in the event's order, the offsets of its part's
encoded body in the raw message and its transfer encoding.  They come from the event
reader's own walk (:func:`masd.core.parts.attachment_sources`, the one
:func:`masd.core.parts.read_parts` lists from), so the n-th span is the n-th listed
attachment.  A span that is :attr:`~masd.core.parts.Source.streamable` is decoded a
piece at a time (:mod:`masd.core.partdecode`) from where :func:`streamed` starts it (a
uuencoded body from its ``begin`` line); a file inside a TNEF part is decoded whole by
:func:`span_bytes`, bounded by the message's size.
"""

from __future__ import annotations

from masd.core.event import MAX_ATTACHMENTS
from masd.core.parts import Source, attachment_sources, source_bytes
from masd.core.uu import UU_ENCODINGS, data_start

__all__ = ["PartSpan", "attachment_spans", "span_bytes", "streamed"]

#: One listed attachment's span (see :class:`masd.core.parts.Source`).
PartSpan = Source


def attachment_spans(raw: bytes) -> list[PartSpan]:
    """The span of each attachment the event lists, in its order."""
    return attachment_sources(raw, limit=MAX_ATTACHMENTS)


def span_bytes(encoded: bytes, span: PartSpan) -> bytes:
    """The attachment's bytes from ``raw[span.start:span.end]``, decoded whole."""
    return source_bytes(encoded, span)


def streamed(raw: bytes, span: PartSpan) -> PartSpan:
    """``span`` as its decoder is fed: a uuencoded body from the end of its ``begin``
    line (:func:`masd.core.uu.data_start`), any other from its start."""
    if span.encoding not in UU_ENCODINGS or not span.streamable:
        return span
    return span._replace(start=data_start(raw, span.start, span.end))
