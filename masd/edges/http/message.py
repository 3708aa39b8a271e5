"""``GET /mas/v0.1/messages/{ref}``, its ``/raw`` bytes and its ``/attachments/{n}``
(docs/protocol.md §16.8, :mod:`masd.read.messages`, :mod:`masd.read.message_bytes`).

Each is a read-side route: the admin, or the master of the message's type.  The bytes are
written as they are read from the store (:mod:`masd.edges.http.ranges`), a single Range
served as 206.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import quote

from aiohttp import hdrs, web

from masd.core.partspans import PartSpan
from masd.edges.http import ranges
from masd.edges.http.auth import may_read
from masd.edges.http.shared import (
    ATTACHMENT_PATH,
    MESSAGE_PATH,
    RAW_PATH,
    HttpRefusal,
    Route,
    Served,
    stored,
)
from masd.read import message_bytes, messages
from masd.read.message_bytes import Mismatch

log = logging.getLogger("masd.http")

#: The spans of attachments served lately (:class:`masd.read.message_bytes.Spans`).
SPANS: Final = message_bytes.Spans()
#: RFC 8187 attr-char besides letters and digits: what ``filename*`` leaves unescaped.
_ATTR_CHARS: Final = "!#$&+-.^_`|~"


async def _message(request: web.Request, edge: Served) -> messages.Message:
    """The message the path names, which the reader must be entitled to."""
    ref = request.match_info["ref"]
    missing = HttpRefusal("unknown-message", f"message_ref: no message {ref}")
    found = await stored(edge.store.read(lambda tx: messages.message(tx, ref)))
    if found is None:
        raise missing
    may_read(request, found.owner, missing)
    return found


async def message(request: web.Request, edge: Served) -> web.StreamResponse:
    return web.json_response((await _message(request, edge)).doc)


async def raw(request: web.Request, edge: Served) -> web.StreamResponse:
    found = await _message(request, edge)
    doc = found.doc["message"]
    ref = doc["message_ref"]

    def pieces(first: int, last: int) -> AsyncIterator[bytes]:
        return message_bytes.raw_pieces(edge.store, ref, first, last + 1)

    headers: dict[str, str] = {hdrs.CONTENT_TYPE: "message/rfc822"}
    return await ranges.serve(request, doc["size"], f'"{doc["sha256"]}"', headers, pieces)


def disposition(filename: str | None) -> str:
    """``Content-Disposition: attachment`` with the filename as RFC 6266 gives it: a
    quoted ASCII ``filename`` (other characters as ``_``), and ``filename*`` in UTF-8
    when the name is not plain ASCII."""
    if not filename:
        return "attachment"
    name = "".join(c if " " <= c <= "~" else "_" for c in filename)
    fallback = name.replace("\\", "_").replace('"', "_")
    value = f'attachment; filename="{fallback}"'
    if name != filename:
        value += "; filename*=UTF-8''" + quote(filename, safe=_ATTR_CHARS)
    return value


async def attachment(request: web.Request, edge: Served) -> web.StreamResponse:
    found = await _message(request, edge)
    doc = found.doc["message"]
    ref, n = doc["message_ref"], request.match_info["n"]
    listed: list[dict[str, Any]] = found.event.get("attachments") or []
    index = int(n) if n.isascii() and n.isdigit() and len(n) <= 9 else len(listed)
    if index >= len(listed):
        raise HttpRefusal(
            "unknown-message", f"n: message {ref} has {len(listed)} attachments, no {n[:20]}"
        )
    entry = listed[index]

    async def locate() -> PartSpan:
        try:
            return await stored(
                edge.store.read(lambda tx: message_bytes.locate(tx, ref, index, entry))
            )
        except Mismatch as exc:
            log.error("attachment not served: %s", exc)
            raise HttpRefusal("unavailable", f"n: {exc}") from exc

    located = await SPANS.find((ref, index, doc["sha256"]), locate)

    def pieces(first: int, last: int) -> AsyncIterator[bytes]:
        return message_bytes.decoded_pieces(edge.store, ref, located, first, last)

    headers: dict[str, str] = {
        hdrs.CONTENT_TYPE: entry.get("content_type") or "application/octet-stream",
        hdrs.CONTENT_DISPOSITION: disposition(entry.get("filename")),
        "X-Content-Type-Options": "nosniff",
    }
    return await ranges.serve(request, entry["size"], f'"{entry["sha256"]}"', headers, pieces)


ROUTES: Final = (
    Route("GET", MESSAGE_PATH, message, "reader"),
    Route("GET", RAW_PATH, raw, "reader"),
    Route("GET", ATTACHMENT_PATH, attachment, "reader"),
)
