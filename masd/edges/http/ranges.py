"""Bytes served a piece at a time, whole or one range of them (RFC 9110 §14).

:func:`serve` answers ``GET`` and ``HEAD`` of a body whose length is known beforehand:
``200`` with every byte, or ``206`` with ``Content-Range`` for a single satisfiable
``Range: bytes=…``; ``416`` (``range-not-satisfiable``, with ``Content-Range: bytes
*/LENGTH``) for a range past the end.  A Range that is not one ``bytes`` range (several,
another unit, a malformed one) is ignored and the whole body sent, as RFC 9110 allows; so
is a Range under an ``If-Range`` that does not match (compared strongly: a weak tag never
does).  An ``If-None-Match`` of ``*``, or listing the ETag weak or strong, is ``304``.  The
body is written as its pieces come, never gathered; one that cannot be completed (the store
fails, the message is erased meanwhile) ends its connection after what was written.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final

from aiohttp import hdrs, web

from masd.edges.http.shared import HttpRefusal
from masd.read.message_bytes import Gone
from masd.store import StoreError

log = logging.getLogger("masd.http")

#: The pieces of bytes ``first`` to ``last`` (inclusive) of the body.
Pieces = Callable[[int, int], AsyncIterator[bytes]]

_ONE_RANGE: Final = re.compile(r"bytes=([0-9]{0,18})-([0-9]{0,18})")
#: An entity-tag of a list (RFC 9110 §8.8.3): its weakness, its quoted opaque tag.
_ENTITY_TAG: Final = re.compile(r'(W/)?("[\x21\x23-\x7e\x80-\uffff]*")')


def none_match(header: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` fails, so the answer is 304 (RFC 9110 §13.1.2): ``*``, or an
    entity-tag in its list equal to ``etag`` by the weak comparison (``W/`` ignored)."""
    if header is None:
        return False
    if header.strip() == "*":
        return True
    return any(tag == etag for _, tag in _ENTITY_TAG.findall(header))


def byte_range(request: web.Request, length: int, etag: str) -> tuple[int, int] | None:
    """The (first, last) byte a single Range asks for; None: the whole body."""
    text = request.headers.get(hdrs.RANGE)
    if text is None:
        return None
    if_range = request.headers.get(hdrs.IF_RANGE)
    if if_range is not None and if_range.strip() != etag:
        return None
    m = _ONE_RANGE.fullmatch(text.strip().replace(" ", ""))
    if m is None or m.group(1) == m.group(2) == "":
        return None  # several ranges, another unit or no range at all: the whole body
    if m.group(1) == "":  # the last N bytes
        count = int(m.group(2))
        if count == 0 or length == 0:
            raise _unsatisfiable(text, length)
        return max(length - count, 0), length - 1
    first = int(m.group(1))
    if m.group(2) != "" and int(m.group(2)) < first:
        return None  # not a valid range: ignored
    if first >= length:
        raise _unsatisfiable(text, length)
    last = length - 1 if m.group(2) == "" else min(int(m.group(2)), length - 1)
    return first, last


def _unsatisfiable(text: str, length: int) -> HttpRefusal:
    return HttpRefusal(
        "range-not-satisfiable",
        f"Range: {text[:60]} lies past the end of the {length} bytes",
        headers={hdrs.CONTENT_RANGE: f"bytes */{length}"},
    )


async def serve(
    request: web.Request, length: int, etag: str, headers: Mapping[str, str], pieces: Pieces
) -> web.StreamResponse:
    """The answer for ``length`` bytes whose ETag is ``etag`` (quoted)."""
    common = {**headers, hdrs.ETAG: etag, hdrs.ACCEPT_RANGES: "bytes"}
    if none_match(request.headers.get(hdrs.IF_NONE_MATCH), etag):
        return web.Response(status=304, headers=common)
    wanted = byte_range(request, length, etag)
    response = web.StreamResponse(status=200 if wanted is None else 206, headers=common)
    first, last = (0, length - 1) if wanted is None else wanted
    if wanted is not None:
        response.headers[hdrs.CONTENT_RANGE] = f"bytes {first}-{last}/{length}"
    response.content_length = last - first + 1
    await response.prepare(request)
    if request.method == hdrs.METH_HEAD or last < first:
        await response.write_eof()
        return response
    sent = 0
    try:
        async for piece in pieces(first, last):
            await response.write(piece)
            sent += len(piece)
    except (StoreError, Gone) as exc:
        return _cut_short(request, response, f"{sent} of {last - first + 1} bytes sent: {exc}")
    except ConnectionError as exc:
        log.info("bytes not all sent path=%s: the client left (%s)", request.path, exc)
        return response
    if sent != last - first + 1:
        return _cut_short(request, response, f"{sent} of {last - first + 1} bytes found")
    await response.write_eof()
    return response


def _cut_short(request: web.Request, response: web.StreamResponse, why: str) -> web.StreamResponse:
    """The head is sent and the body cannot be completed: the connection is closed after
    what was written, so the client sees the body is short (RFC 9112 §6.3), and nothing
    more is read on it as though it were the body."""
    log.error("bytes cut short path=%s: %s", request.path, why)
    response.force_close()
    if request.transport is not None:
        request.transport.close()
    return response
