"""What each route of the HTTP listener takes and answers, as data: one :class:`Operation`
per method and path (:data:`OPERATIONS`), and what each message masd sends to peers is for
(:data:`OUTBOUND`).  :mod:`masd.edges.http.openapi` builds the OpenAPI document from them.

A refusal is named by its kind; its status comes from
:data:`~masd.edges.http.shared.REPLIES`.  Every route also refuses with
``unauthenticated`` (unless anyone may call it) and ``unavailable`` (masd failed), which
the document adds by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from masd.edges.http.openapi_schemas import Schema, ref

#: Who may call: no secret, the admin secret, a peer's secret, or the admin secret or
#: a master's own secret for its own types (the read side of docs/protocol.md §16).
Who = Literal["anyone", "admin", "peer", "reader"]

#: Kinds that routes described here but not served yet answer, which REPLIES does not list
#: yet; each leaves once REPLIES has it (tests/test_openapi.py checks).
ARRIVING_REPLIES: Final[Mapping[str, int]] = {}

#: Auth kinds of routes the document leaves out: the operator console (``"console"``) is
#: HTML pages for a browser behind a session cookie, a user interface and not part of the
#: API, so none of its routes is described (tests/test_openapi.py compares the others).
UNDOCUMENTED: Final = frozenset({"console"})


@dataclass(frozen=True)
class Answer:
    """A success: its status, its media type and schema (None: no body), its headers."""

    status: int
    description: str
    schema: Schema | None = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    """One method on one path: what it is for, its parameters, its answers and refusals."""

    method: str
    path: str
    summary: str
    description: str
    who: Who
    answers: tuple[Answer, ...]
    refusals: tuple[str, ...] = ()
    parameters: tuple[Schema, ...] = ()
    body: Schema | None = None
    extra_content: Mapping[int, Mapping[str, Schema]] = field(default_factory=dict)


def query(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def path_param(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def header(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _limit(default: int, high: int) -> Schema:
    return {"type": "integer", "minimum": 1, "maximum": high, "default": default}


_LIMIT_1000: Final = _limit(100, 1000)
_KEY: Final = {
    **path_param(
        "key",
        {"type": "string", "minLength": 1},
        "The case's address or key, in any spelling, percent-encoded (docs/protocol.md §2).",
    ),
    "example": "ticket=gs-1@help.example",
}
_MESSAGE_REF: Final = path_param(
    "ref", {"type": "string", "minLength": 1}, "The `message_ref` masd gave the mail."
)
_INTAKE_REF: Final = path_param(
    "ref", {"type": "string", "minLength": 1}, "The `intake_ref` masd gave the intake."
)
_CONDITIONS: Final = (
    header("Range", {"type": "string"}, "One byte range, e.g. `bytes=0-1023`."),
    header("If-Range", {"type": "string"}, "The Range holds only while the ETag is this one."),
    header(
        "If-None-Match",
        {"type": "string"},
        "`*`, or a list naming the ETag (`W/` or not, compared weakly): 304, no body.",
    ),
)
_BYTES_HEADERS: Final = ("ETag", "Accept-Ranges")
_ATTACHMENT_HEADERS: Final = (*_BYTES_HEADERS, "Content-Disposition", "X-Content-Type-Options")
_ITEM_ID: Final = path_param(
    "id", {"type": "string", "pattern": r"^[0-9]{1,18}$"}, "The outbox item's id."
)
_AFTER_CURSOR: Final = (
    "A cursor masd gave (`next` of the previous page); omitted: from the start. Empty is "
    "refused, as any text that is not a cursor: a client whose `next` was null (the last "
    "page) is told so rather than led back to the start."
)
#: A cursor: never empty (docs/protocol.md §16.4).
_CURSOR: Final = {"type": "string", "minLength": 1}

#: The contract messages masd receives (docs/protocol.md §8).
INBOUND: Final = ("handoff.status", "case.assign", "case.policy", "mail.send", "handoff.cancel")
#: The contract messages masd sends, with the peers they go to (docs/protocol.md §8, §10).
OUTBOUND: Final[Mapping[str, str]] = {
    "handoff.request": "masd asks a mode endpoint (master role) or a transfers webhook (slave "
    "role) to take the case over; the statuses go to its `status_url` (docs/protocol.md §8.6). "
    "The first status may carry any `seq` from 0; each later one a greater `seq`.",
    "handoff.update": "Details the participant gave in answer to a negotiation question, "
    "to the mode (docs/protocol.md §8.7).",
    "handoff.cancel": "A handoff ends on masd's side: its deadline passed "
    "(`reason: timed-out`), or a master's cancel is passed on to the webhook "
    "(docs/protocol.md §8.8).",
    "handoff.status": "Slave role: each status accepted from the webhook, relayed to the master "
    "with the webhook's `seq` (docs/protocol.md §8.9).",
    "case.intake": "Slave role: mail to a type's intake address, to the type's master, which "
    "answers later with `case.assign` (docs/protocol.md §8.10).",
    "case.message": "Slave role: every mail on an assigned case, to the master; `mail.send` "
    "may answer its `message_ref` (docs/protocol.md §8.11).",
    "handoff.requested": "Slave role: a `!MODE` request on the master's case, and whether it "
    "went to a webhook (docs/protocol.md §8.12).",
}

_MESSAGES = "/mas/v0.1/messages"
_CASES = "/mas/v0.1/cases"
_OUTBOX = "/mas/v0.1/admin/outbox"
_INTAKES = "/mas/v0.1/intakes"

OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        "POST",
        _MESSAGES,
        "A contract message to masd",
        "Every contract message sent to masd, and the `status_url` of every `handoff.request` "
        "(docs/protocol.md §8, §9). The checks run in the order of docs/protocol.md §9.3 and the "
        "first that fails answers. A repeated (peer, `id`) gets the first answer again, even "
        "when the body changed. A peer may send only its own types, for its own cases and "
        "handoffs. A 503 means masd failed: send the same `id` again.",
        "peer",
        (
            Answer(
                200,
                "Accepted, or known already: `ignored` says when nothing was recorded (a stale "
                "`seq`; a cancel of a request that was never forwarded); `sent` answers a "
                "`mail.send`; `case` answers a `case.assign`.",
                ref("MessageAnswer"),
            ),
        ),
        (
            "unauthenticated",
            "unsupported-media-type",
            "too-large",
            "invalid-message",
            "unsupported-version",
            "unknown-type",
            "forbidden",
            "unknown-case",
            "unknown-handoff",
            "unknown-intake",
            "invalid-transition",
            "already-assigned",
            "refused",
            "expectation-failed",
        ),
        body={"oneOf": [ref(t) for t in INBOUND]},
    ),
    Operation(
        "GET",
        "/healthz",
        "Whether the store accepts a write",
        "No secret. 200 while the store accepts a write (tested at most every 5 s), otherwise "
        "503 with error `store` (docs/protocol.md §9.7).",
        "anyone",
        (Answer(200, "The store accepts writes.", ref("Ok")),),
        ("store",),
    ),
    Operation(
        "GET",
        "/metrics",
        "Counters and gauges",
        "No secret. The Prometheus text format (docs/protocol.md §9.7).",
        "anyone",
        (Answer(200, "The metrics.", {"type": "string"}, "text/plain"),),
    ),
    Operation(
        "GET",
        "/openapi.json",
        "This document",
        "No secret. The OpenAPI description of this listener; the source keeps the same bytes "
        "in docs/openapi.json.",
        "anyone",
        (Answer(200, "The document.", ref("OpenApi")),),
    ),
    Operation(
        "GET",
        _CASES + "/{key}",
        "One case",
        "A case with its handoffs (docs/protocol.md §16.1).",
        "reader",
        (Answer(200, "The case.", ref("Case")),),
        ("unknown-case",),
        (_KEY,),
    ),
    Operation(
        "GET",
        _CASES + "/{key}/thread",
        "A case's thread, page by page",
        "The entries after `after`, at most `limit`, in order; `next` is the `after` of the "
        "next page (docs/protocol.md §16.2, §16.3).",
        "reader",
        (Answer(200, "A page of the thread.", ref("Thread")),),
        ("invalid-message", "unknown-case"),
        (
            _KEY,
            query(
                "after",
                {"type": "integer", "minimum": 0, "maximum": 2**63 - 1, "default": 0},
                "The `seq` after which the page starts.",
            ),
            query("limit", _LIMIT_1000, "At most this many entries."),
        ),
    ),
    Operation(
        "GET",
        _CASES,
        "The case list",
        "Cases, the most recently active first (docs/protocol.md §16.4). A parameter masd "
        "cannot read is 400 naming it. A master's secret lists its own types' cases only.",
        "reader",
        (Answer(200, "A page of cases; `next` is null when none follows.", ref("CaseList")),),
        ("invalid-message",),
        (
            query("after", _CURSOR, _AFTER_CURSOR),
            query("limit", _limit(50, 1000), "At most this many cases."),
            query("state", {"enum": ["open", "closed"]}, "With a handoff not closed, or without."),
            query(
                "participant",
                {"type": "string", "maxLength": 320},
                "Only this participant's cases (compared without regard to case).",
            ),
            query("domain", {"type": "string", "maxLength": 320}, "Only this domain's cases."),
        ),
    ),
    Operation(
        "GET",
        "/mas/v0.1/events",
        "The event feed",
        "Every thread entry of every case in commit order (docs/protocol.md §16.5). With "
        "`wait` the request is held until an event exists. With `Accept: text/event-stream` "
        "the events stream as Server-Sent Events (`id:` the cursor, `event:` the entry's kind, "
        "`data:` the event), resuming after `Last-Event-ID`. A master's secret sees its own "
        "types' events only.",
        "reader",
        (Answer(200, "A page of events; `next` is the `after` of the next page.", ref("Events")),),
        ("invalid-message", "unknown-case"),
        (
            query("after", _CURSOR, _AFTER_CURSOR),
            query("limit", _LIMIT_1000, "At most this many events."),
            query(
                "wait",
                {"type": "integer", "minimum": 0, "maximum": 60, "default": 0},
                "Seconds to hold the request while no event follows `after`.",
            ),
            query(
                "case",
                {"type": "string", "minLength": 1},
                "Only this case's events: an address or key, or an id only one case has.",
            ),
            header(
                "Last-Event-ID",
                {"type": "string"},
                "With text/event-stream: the last cursor seen (wins over `after`).",
            ),
        ),
        extra_content={200: {"text/event-stream": {"type": "string"}}},
    ),
    Operation(
        "GET",
        _OUTBOX,
        "The outbound queue",
        "Items waiting (queued, retrying), then those given up (failed), each oldest first "
        "(docs/protocol.md §16.7).",
        "admin",
        (Answer(200, "The items.", ref("Queue")),),
        ("invalid-message",),
        (query("limit", _LIMIT_1000, "At most this many items."),),
    ),
    Operation(
        "POST",
        _OUTBOX + "/retry",
        "Every waiting item due now",
        "Makes every item waiting for a later try due now (docs/protocol.md §16.7). No body.",
        "admin",
        (Answer(200, "The ids of the items made due.", ref("Retried")),),
    ),
    Operation(
        "POST",
        _OUTBOX + "/{id}/retry",
        "One item due now",
        "Makes the item due now; a failed item waits again, for a new `server.retry_for` "
        "(docs/protocol.md §16.7). No body.",
        "admin",
        (Answer(200, "The item as it now stands.", ref("ItemChanged")),),
        ("unknown-item", "wrong-state"),
        (_ITEM_ID,),
    ),
    Operation(
        "POST",
        _OUTBOX + "/{id}/drop",
        "Withdraw one item",
        "The item is never sent; its case's thread records a `delivery.failed` entry "
        "(docs/protocol.md §16.7). No body.",
        "admin",
        (Answer(200, "The item as it now stands.", ref("ItemChanged")),),
        ("unknown-item", "wrong-state"),
        (_ITEM_ID,),
    ),
    # ------------------------------------------------- the mail itself (docs/protocol.md §15)
    Operation(
        "GET",
        _MESSAGES + "/{ref}",
        "A recorded mail",
        "What masd recorded of a mail: its case (null while its intake is pending), its intake, "
        "size, SHA-256 and gateway event (docs/protocol.md §15, §16.8).",
        "reader",
        (Answer(200, "The message.", ref("Message")),),
        ("unknown-message",),
        (_MESSAGE_REF,),
    ),
    Operation(
        "GET",
        _MESSAGES + "/{ref}/raw",
        "A mail's bytes",
        "Exactly the bytes received over LMTP; the ETag is their SHA-256. One `Range` is "
        "honoured (206); a range past the end is 416; any other Range is ignored.",
        "reader",
        (
            Answer(200, "The raw message.", {"type": "string"}, "message/rfc822", _BYTES_HEADERS),
            Answer(
                206,
                "The range asked for.",
                {"type": "string"},
                "message/rfc822",
                (*_BYTES_HEADERS, "Content-Range"),
            ),
            Answer(304, "The ETag named in If-None-Match: not modified.", None, "", _BYTES_HEADERS),
        ),
        ("unknown-message", "range-not-satisfiable"),
        (_MESSAGE_REF, *_CONDITIONS),
    ),
    Operation(
        "GET",
        _MESSAGES + "/{ref}/attachments/{n}",
        "One attachment's decoded bytes",
        "The attachment `n` of the event's `attachments` (from 0), with the Content-Type the "
        "event gives, `Content-Disposition: attachment` with its filename (`filename*` when it "
        "is not ASCII), `X-Content-Type-Options: nosniff`, and the ETag its `sha256`. One "
        "`Range` is honoured (206); a range past the end is 416; any other Range is ignored. "
        "An `n` the event does not list is 404 `unknown-message`.",
        "reader",
        (
            Answer(200, "The attachment.", {"type": "string"}, "*/*", _ATTACHMENT_HEADERS),
            Answer(
                206,
                "The range asked for.",
                {"type": "string"},
                "*/*",
                (*_ATTACHMENT_HEADERS, "Content-Range"),
            ),
            Answer(304, "The ETag named in If-None-Match: not modified.", None, "", _BYTES_HEADERS),
        ),
        ("unknown-message", "range-not-satisfiable"),
        (
            _MESSAGE_REF,
            path_param("n", {"type": "integer", "minimum": 0}, "Index into event.attachments."),
            *_CONDITIONS,
        ),
    ),
    Operation(
        "GET",
        _INTAKES,
        "Intakes of slave types",
        "Intakes waiting for their `case.assign`, or those assigned, oldest first; all of them "
        "when `state` is omitted. A master's secret sees its own types' intakes only "
        "(docs/protocol.md §13.1, §16.9).",
        "reader",
        (
            Answer(
                200,
                "A page of intakes; `next` is the cursor of the last one shown (the `after` "
                "given when none is), to poll with.",
                ref("Intakes"),
            ),
        ),
        ("invalid-message",),
        (
            query(
                "state", {"enum": ["pending", "assigned"]}, "Pending or assigned; omitted: both."
            ),
            query("after", _CURSOR, _AFTER_CURSOR),
            query("limit", _limit(100, 1000), "At most this many intakes."),
        ),
    ),
    Operation(
        "POST",
        _INTAKES + "/{ref}/resend",
        "Send a pending intake's case.intake again",
        "The intake's `case.intake` goes to the type's master again, with a fresh `id`, "
        "through the outbox (docs/protocol.md §16.9). No body.",
        "admin",
        (Answer(200, "Queued: the new message's `id` and its outbox item.", ref("Resent")),),
        ("unknown-intake", "wrong-state"),
        (_INTAKE_REF,),
    ),
    Operation(
        "POST",
        _CASES + "/{key}/erase",
        "Erase one case",
        "The case's mail, thread, handoffs and outbox rows are removed at once; an open "
        "handoff is cancelled first (`handoff.cancel`, reason `erased`), and the event feed "
        "keeps one `case.erased` entry (docs/protocol.md §16.11). No body.",
        "admin",
        (Answer(200, "Erased: the rows removed, per table.", ref("Erased")),),
        ("unknown-case",),
        (_KEY,),
    ),
)
