"""A case as the operator console shows it (docs/operations.md, the console): the case,
a page of its thread, the message of each ``mail.in`` on it, and what the header counts.

One function of a store read job, so the page is one snapshot: the documents are those of
:func:`masd.read.case_views.case_json` and ``thread_json`` and, for each mail, the
``message`` of :func:`masd.read.messages.message` (``GET /mas/v0.1/messages/{ref}``).  The
header counts the whole thread, so when the page is not all of it (a later page, or one
full) the rest of the thread and its mails are read too.  :func:`mails` alone serves the
live feed, which reads the mails of the entries it relays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from masd.read import case_views, feed, messages
from masd.store import Tx

#: Entries read at most to count a thread (as ``masd case show`` reads it whole).
WHOLE: Final = 10**9


@dataclass(frozen=True)
class CasePage:
    """``case`` and ``thread`` (the page asked for), ``mails`` (``message`` documents by
    ``message_ref``, for the whole thread), ``whole`` (every entry, for the counts) and
    ``feed_after`` (the event feed's cursor of the case when it was read)."""

    case: dict[str, Any]
    thread: dict[str, Any]
    whole: list[dict[str, Any]]
    mails: dict[str, dict[str, Any]]
    feed_after: str


def mails(tx: Tx, entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``message`` of each ``mail.in`` among ``entries``, by ``message_ref`` (a mail
    whose message is gone, erased, has none)."""
    found: dict[str, dict[str, Any]] = {}
    for e in entries:
        ref = e.get("message_ref")
        if e.get("kind") != "mail.in" or not isinstance(ref, str) or ref in found:
            continue
        message = messages.message(tx, ref)
        if message is not None:
            found[ref] = message.doc["message"]
    return found


def case_page(tx: Tx, key: str, after: int, limit: int) -> CasePage | None:
    """The case whose address or key is ``key``, its entries after ``after`` (at most
    ``limit``) and their mails; None if no such case."""
    case = case_views.case_json(tx, key)
    if case is None:
        return None
    case_key = case["case"]["key"]
    thread = case_views.thread_json(tx, case_key, after, limit) or {"entries": [], "next": after}
    whole: list[dict[str, Any]] = thread["entries"]
    if after > 0 or len(whole) >= limit:
        every = case_views.thread_json(tx, case_key, 0, WHOLE)
        whole = every["entries"] if every else []
    latest = feed.latest(tx, 1, case_key).next
    return CasePage(case, thread, whole, mails(tx, whole), latest)
