"""The reading tools of the MCP edge: the read side's functions, the read side's rule
(docs/protocol.md §16, §23).

Each tool reads what the HTTP route of the same name reads (:mod:`masd.read.case_views`,
:mod:`masd.read.messages`, :mod:`masd.read.message_bytes`, :mod:`masd.read.feed`), asks
:func:`masd.edges.http.auth.may_read_as` of each thing it shows and takes its bounds from
the route's, so a refusal carries the route's error code and detail.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final

from masd.edges.http import message as message_route
from masd.edges.http.auth import may_read_as
from masd.edges.http.events import case_key_for
from masd.edges.http.shared import ATTACHMENT_PATH, HttpRefusal, Served, bad, show, stored
from masd.read import case_views as readside
from masd.read import feed, message_bytes, messages
from masd.read.access import Owned, Reader
from masd.read.feed_hub import Follower, FollowersFull
from masd.read.message_bytes import Mismatch

#: The largest attachment given inline (an embedded resource); a larger one is a link.
INLINE_BYTES: Final = 512 * 1024
#: The longest a wait_events call is held, in seconds.
MAX_WAIT: Final = 30
#: The longest participant or domain filter (as GET /mas/v0.1/cases).
MAX_FILTER: Final = 320
_MAX_SEQ: Final = 2**63 - 1

Args = Mapping[str, Any]


def text_arg(args: Args, name: str, limit: int, *, required: bool = False) -> str | None:
    """The string argument ``name``, at most ``limit`` characters."""
    value = args.get(name)
    if value is None:
        if required:
            raise bad(name, "missing")
        return None
    if not isinstance(value, str) or not value:
        raise bad(name, "not a non-empty string")
    if len(value) > limit:
        raise bad(name, f"longer than {limit} characters")
    return value


def int_arg(args: Args, name: str, default: int, low: int, high: int) -> int:
    """The integer argument ``name``, from ``low`` to ``high`` (as the route's query)."""
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(name, f"{show(str(value))} is not an integer from {low} to {high}")
    return value


async def list_cases(edge: Served, who: Reader, args: Args) -> dict[str, Any]:
    """``GET /mas/v0.1/cases``."""
    text = text_arg(args, "after", 64)
    after = None if text is None else readside.parse_case_cursor(text)
    if text is not None and after is None:
        raise bad("after", f"{show(text)} is not a cursor of the case list")
    limit = int_arg(args, "limit", readside.DEFAULT_CASES, 1, readside.MAX_LIMIT)
    state = text_arg(args, "state", 16)
    if state is not None and state not in readside.CASE_STATES:
        raise bad("state", f"{show(state)} is not open or closed")
    where = readside.CaseFilter(
        state, text_arg(args, "participant", MAX_FILTER), text_arg(args, "domain", MAX_FILTER)
    )
    scope = who.scope
    return await stored(
        edge.store.read(lambda tx: readside.cases_json(tx, after, limit, where, scope))
    )


async def _case(edge: Served, who: Reader, key: str) -> dict[str, Any]:
    """The case ``key`` names, which ``who`` must be entitled to (as GET .../cases/{key})."""
    missing = HttpRefusal("unknown-case", f"key: no case {key}")
    doc = await stored(edge.store.read(lambda db: readside.case_json(db, key)))
    if doc is None:
        raise missing
    case: dict[str, Any] = doc["case"]
    may_read_as(who, Owned(case["domain"], case["type"]), missing)
    return case


async def read_case(edge: Served, who: Reader, args: Args) -> dict[str, Any]:
    """``GET /mas/v0.1/cases/{key}`` and a page of ``.../thread``."""
    key = text_arg(args, "key", 1024, required=True)
    assert key is not None
    after = int_arg(args, "after", 0, 0, _MAX_SEQ)
    limit = int_arg(args, "limit", readside.DEFAULT_LIMIT, 1, readside.MAX_LIMIT)
    case = await _case(edge, who, key)
    thread = await stored(
        edge.store.read(lambda db: readside.thread_json(db, case["key"], after, limit))
    )
    if thread is None:
        raise HttpRefusal("unknown-case", f"key: no case {key}")
    return {"case": case, "thread": thread}


async def _message(edge: Served, who: Reader, args: Args) -> messages.Message:
    ref = text_arg(args, "message_ref", 128, required=True)
    assert ref is not None
    missing = HttpRefusal("unknown-message", f"message_ref: no message {ref}")
    found = await stored(edge.store.read(lambda tx: messages.message(tx, ref)))
    if found is None:
        raise missing
    may_read_as(who, found.owner, missing)
    return found


async def read_message(edge: Served, who: Reader, args: Args) -> dict[str, Any]:
    """``GET /mas/v0.1/messages/{ref}``: the event (its ``text``, ``reply_text``, attachments)."""
    return (await _message(edge, who, args)).doc


async def read_attachment(
    edge: Served, who: Reader, args: Args
) -> tuple[dict[str, Any], bytes | None]:
    """``GET .../attachments/{n}``: the attachment's entry, and its decoded bytes when it
    is at most :data:`INLINE_BYTES` (else None: the entry's ``url`` serves it)."""
    found = await _message(edge, who, args)
    doc = found.doc["message"]
    ref = doc["message_ref"]
    listed: list[dict[str, Any]] = found.event.get("attachments") or []
    n = args.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(listed):
        raise HttpRefusal(
            "unknown-message",
            f"n: message {ref} has {len(listed)} attachments, no {str(n)[:20]}",
        )
    entry = listed[n]
    url = edge.rt.config.server.public_url.rstrip("/") + ATTACHMENT_PATH.format(ref=ref, n=n)
    shown = {**entry, "n": n, "url": url}
    if entry["size"] > INLINE_BYTES:
        return shown, None
    key = (ref, n, doc["sha256"])
    span = message_route.SPANS.get(key)
    if span is None:
        try:
            span = await stored(edge.store.read(lambda tx: message_bytes.locate(tx, ref, n, entry)))
        except Mismatch as exc:
            raise HttpRefusal("unavailable", f"n: {exc}") from exc
        message_route.SPANS.put(key, span)
    pieces = message_bytes.decoded_pieces(edge.store, ref, span, 0, entry["size"] - 1)
    return shown, b"".join([piece async for piece in pieces])


def blob(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def wait_events(edge: Served, who: Reader, args: Args) -> dict[str, Any]:
    """``GET /mas/v0.1/events?wait=``: the events after ``after`` that ``who`` may read,
    held up to ``wait`` seconds (at most :data:`MAX_WAIT`) until there is one."""
    text = text_arg(args, "after", 64)
    after = 0 if text is None else feed.parse_cursor(text)
    if after is None:
        raise bad("after", f"{show(text)} is not a cursor of the event feed")
    limit = int_arg(args, "limit", feed.DEFAULT_EVENTS, 1, feed.MAX_EVENTS)
    wait = int_arg(args, "wait", 0, 0, MAX_WAIT)
    case_key = await case_key_for(edge, who, text_arg(args, "case", 1024))
    scope = who.scope
    follower = Follower(after, case_key, who)
    try:
        with edge.hub.joined(follower, edge.rt.config.server.max_followers):
            page = await stored(
                feed.follow(
                    edge.store,
                    edge.feed,
                    after,
                    limit=limit,
                    case_key=case_key,
                    wait=float(wait),
                    scope=scope,
                )
            )
    except FollowersFull as exc:
        raise HttpRefusal("unavailable", f"feed: {exc}; retry later") from exc
    if page.ahead:
        raise bad(
            "after",
            f"{text} is past the latest event of this store (was it restored from a "
            "backup?); start again without after",
        )
    return {**page.json(), "count": len(page.events)}
