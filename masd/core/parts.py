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
from masd.core.tnef import is_tnef, tnef_files

__all__ = ["Listed", "Parts", "read_parts"]


class Listed(NamedTuple):
    """One attachment as the event lists it."""

    filename: str | None
    content_type: str
    size: int
    sha256: str


class Parts(NamedTuple):
    text: str
    attachments: tuple[Listed, ...]
    #: attachments found but left out of the list (over its bound)
    omitted: int


def _body_text(leaf: Leaf, limit: int) -> str:
    text = lf(decode(leaf.decoded(), leaf.charset))
    if leaf.content_type == "text/html":
        text = html_to_text(text)
    return cap_utf8(text.replace("\x00", "\ufffd"), limit)


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


def _entries(leaf: Leaf) -> Iterator[tuple[str | None, str, bytes]]:
    """(filename, content type, bytes) of what one attachment leaf lists."""
    data = leaf.decoded()
    if leaf.content_type == "message/rfc822":
        yield _message_name(leaf, data), leaf.content_type, data
        return
    yield leaf.filename, leaf.content_type, data
    if is_tnef(leaf.content_type, leaf.filename):
        for name, inner in tnef_files(data):
            name = cap(one_line(name), MAX_FILENAME) or None if name else None
            yield name, "application/octet-stream", inner


def _is_listed(leaf: Leaf) -> bool:
    return (
        leaf.is_attachment or leaf.filename is not None or not leaf.content_type.startswith("text/")
    )


def read_parts(
    first: Mapping[str, str], raw: bytes, body: int, *, text_limit: int, limit: int
) -> Parts:
    """The text, the listed attachments and how many more were left out.

    ``raw[body:]`` is the message's body, ``first`` its headers' first values."""
    found = list(leaves(first, raw, body))
    body_leaf = _body_leaf(found)
    text = _body_text(body_leaf, text_limit) if body_leaf is not None else ""
    listed: list[Listed] = []
    omitted = 0
    for leaf in found:
        if leaf is body_leaf or not _is_listed(leaf):
            continue
        if len(listed) >= limit:
            omitted += 1  # counted without decoding (a TNEF's inner files unseen)
            continue
        for name, ctype, data in _entries(leaf):
            if len(listed) >= limit:
                omitted += 1
            else:
                listed.append(_listed(name, ctype, data))
    return Parts(text, tuple(listed), omitted)
