"""Which part of a message is its text, and which parts are its attachments.

* The text is the first text/plain leaf not marked ``Content-Disposition:
  attachment`` (a filename alone does not make a part an attachment), else the
  first such text/html leaf turned into text.  Leaves come in document order
  with multipart/alternative flattened, so in an alternative its text/plain
  part wins over the text/html one before it, as in the standard library's
  ``get_body(("plain", "html"))``.
* Every other leaf that is marked attachment, has a filename or is not
  text/* is an attachment.  A message/rfc822 part is one attachment, named by
  its filename parameter else by its subject plus ``.eml`` (``message.eml``
  without one); a TNEF part is
  listed as itself, then each file inside it.
* The list holds at most ``limit`` entries; the rest are counted, not hashed.

The same walk tells where each listed attachment's bytes lie in the message
(:func:`attachment_sources`, what the attachment route serves from), so the
n-th source is always the n-th listed attachment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from masd.core.htmltext import html_to_text
from masd.core.mime import (
    MAX_FILENAME,
    Leaf,
    cap,
    cap_utf8,
    decode,
    decode_words,
    entity_at,
    first_of,
    leaves,
    lf,
    one_line,
)
from masd.core.reply import reply_text
from masd.core.reply_html import html_reply_text
from masd.core.tnef import is_tnef, tnef_files

__all__ = ["Listed", "Parts", "Source", "attachment_sources", "read_parts", "source_bytes"]


class Listed(NamedTuple):
    """One attachment as the event lists it."""

    filename: str | None
    content_type: str
    size: int
    sha256: str


class Source(NamedTuple):
    """Where one listed attachment's bytes lie: its part's encoded body ``raw[start:end]``
    in its transfer encoding and, for a file inside a TNEF part, its index among them."""

    content_type: str
    filename: str | None
    encoding: str
    start: int
    end: int
    #: the index of the file inside the TNEF part; None: the part's own bytes
    inner: int | None

    @property
    def streamable(self) -> bool:
        """Its bytes are its encoded body decoded a piece at a time (base64,
        quoted-printable, uuencode or none); else (a file inside a TNEF part) they are
        decoded whole."""
        return self.inner is None


class Parts(NamedTuple):
    text: str
    #: the text less quoted mail and signatures (masd.core.reply)
    reply_text: str
    attachments: tuple[Listed, ...]
    #: attachments found but left out of the list (over its bound)
    omitted: int


def _body_text(leaf: Leaf, limit: int) -> tuple[str, str]:
    """The body's text and its reply text, each at most ``limit`` bytes of UTF-8."""
    text = lf(decode(leaf.decoded(), leaf.charset))
    if leaf.content_type == "text/html":
        html = text
        text = html_to_text(html).replace("\x00", "\ufffd")
        reply = html_reply_text(html, text).replace("\x00", "\ufffd")
    else:
        text = text.replace("\x00", "\ufffd")
        reply = reply_text(text)
    return cap_utf8(text, limit), cap_utf8(reply, limit)


def _body_leaf(found: Iterable[Leaf]) -> Leaf | None:
    html: Leaf | None = None
    for leaf in found:
        if leaf.is_attachment:
            continue
        if leaf.content_type == "text/plain":
            return leaf
        if leaf.content_type == "text/html" and html is None:
            html = leaf
    return html


def _listed(filename: str | None, content_type: str, data: bytes) -> Listed:
    return Listed(filename, content_type, len(data), hashlib.sha256(data).hexdigest())


def _safe_name(text: str) -> str:
    return text.replace("/", "_").replace("\\", "_")


def _message_name(leaf: Leaf, data: bytes) -> str | None:
    """A forwarded message's name: its filename parameter, else its subject + ``.eml``."""
    if leaf.filename:
        return leaf.filename
    subject = first_of(entity_at(data, 0, len(data))[0]).get("subject", "")
    name = _safe_name(one_line(decode_words(subject)))
    return cap(name, MAX_FILENAME - 4) + ".eml" if name else "message.eml"


def _source(leaf: Leaf, filename: str | None, content_type: str, inner: int | None) -> Source:
    return Source(content_type, filename, leaf.encoding, leaf.start, leaf.end, inner)


def _entries(leaf: Leaf, wanted: bool) -> Iterator[tuple[Source, bytes]]:
    """Where each attachment one leaf lists comes from, and its bytes (``b""`` for the
    leaf's own unless ``wanted``: decoded only where the listing itself needs them)."""
    rfc822 = leaf.content_type == "message/rfc822"
    tnef = not rfc822 and is_tnef(leaf.content_type, leaf.filename)
    data = leaf.decoded() if wanted or tnef or (rfc822 and not leaf.filename) else b""
    if rfc822:
        yield _source(leaf, _message_name(leaf, data), leaf.content_type, None), data
        return
    yield _source(leaf, leaf.filename, leaf.content_type, None), data
    if tnef:
        for index, (name, inner) in enumerate(tnef_files(data)):
            name = cap(one_line(name), MAX_FILENAME) or None if name else None
            yield _source(leaf, name, "application/octet-stream", index), inner


def _is_listed(leaf: Leaf) -> bool:
    return (
        leaf.is_attachment or leaf.filename is not None or not leaf.content_type.startswith("text/")
    )


def _listed_entries(
    found: Iterable[Leaf], body_leaf: Leaf | None, limit: int, *, wanted: bool = True
) -> Iterator[tuple[Source, bytes] | None]:
    """Each listed attachment's source and bytes, in the list's order; ``None`` for each
    one left out over ``limit`` (a leaf past the bound counted once, undecoded)."""
    count = 0
    for leaf in found:
        if leaf is body_leaf or not _is_listed(leaf):
            continue
        if count >= limit:
            yield None  # counted without decoding (a TNEF's inner files unseen)
            continue
        for entry in _entries(leaf, wanted):
            if count >= limit:
                yield None
            else:
                count += 1
                yield entry


def read_parts(
    first: Mapping[str, str], raw: bytes, body: int, *, text_limit: int, limit: int
) -> Parts:
    """The text, the listed attachments and how many more were left out.

    ``raw[body:]`` is the message's body, ``first`` its headers' first values."""
    found = list(leaves(first, raw, body))
    body_leaf = _body_leaf(found)
    text, reply = _body_text(body_leaf, text_limit) if body_leaf is not None else ("", "")
    listed: list[Listed] = []
    omitted = 0
    for entry in _listed_entries(found, body_leaf, limit):
        if entry is None:
            omitted += 1
        else:
            source, data = entry
            listed.append(_listed(source.filename, source.content_type, data))
    return Parts(text, reply, tuple(listed), omitted)


def attachment_sources(raw: bytes, *, limit: int) -> list[Source]:
    """Where the bytes of each attachment :func:`read_parts` lists for the whole message
    ``raw`` come from, in the same order (the same walk, keeping offsets)."""
    headers, body = entity_at(raw, 0, len(raw))
    found = list(leaves(first_of(headers), raw, body))
    entries = _listed_entries(found, _body_leaf(found), limit, wanted=False)
    return [entry[0] for entry in entries if entry]


def source_bytes(encoded: bytes, source: Source) -> bytes:
    """The bytes of the attachment at ``source``, from its encoded body ``raw[start:end]``
    decoded whole (as the event reader decodes it)."""
    leaf = Leaf(
        source.content_type, None, "", source.filename, source.encoding, memoryview(encoded)
    )
    data = leaf.decoded()
    if source.inner is None:
        return data
    files = tnef_files(data)
    return files[source.inner][1] if source.inner < len(files) else b""
