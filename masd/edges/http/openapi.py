"""The OpenAPI 3.1 description of the HTTP listener, built from the routes' descriptions
(:mod:`masd.edges.http.openapi_routes`) and the shapes of
:mod:`masd.edges.http.openapi_schemas`; each refusal's status from
:data:`~masd.edges.http.shared.REPLIES`.

Every GET route answers HEAD too, so each GET operation gets its HEAD twin.  Under
``webhooks``: every message masd sends to peers.  ``GET /openapi.json`` serves
:func:`rendered`; the source keeps the same bytes in ``docs/openapi.json``, regenerated
with ``python -m masd.edges.http > docs/openapi.json`` (``make openapi``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any, Final

from masd import __version__
from masd.edges.http.openapi_routes import (
    ARRIVING_REPLIES,
    OPERATIONS,
    OUTBOUND,
    Operation,
    Who,
)
from masd.edges.http.openapi_schemas import Schema, answer_schemas, contract_schemas, ref
from masd.edges.http.shared import REPLIES

_HEADERS: Final[Mapping[str, Schema]] = {
    "WWW-Authenticate": {"description": 'Bearer realm="masd"', "schema": {"type": "string"}},
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "string"},
    },
    "ETag": {"description": "The SHA-256 of the bytes, quoted.", "schema": {"type": "string"}},
    "Content-Disposition": {
        "description": "attachment, with the filename.",
        "schema": {"type": "string"},
    },
    "X-Content-Type-Options": {"description": "nosniff", "schema": {"type": "string"}},
    "Accept-Ranges": {"description": "bytes", "schema": {"type": "string"}},
    "Content-Range": {
        "description": "The range given and the size: `bytes FIRST-LAST/SIZE`, or on a 416 "
        "`bytes */SIZE`.",
        "schema": {"type": "string"},
    },
}

#: Headers a refusal of this status carries.
_REFUSAL_HEADERS: Final[Mapping[int, tuple[str, ...]]] = {
    401: ("WWW-Authenticate",),
    416: ("Content-Range",),
    503: ("Retry-After",),
}

#: Who may call, as security requirements: ``"reader"`` takes either secret.
_SECURITY: Final[Mapping[Who, list[dict[str, list[str]]]]] = {
    "anyone": [],
    "admin": [{"admin": []}],
    "peer": [{"peer": []}],
    "reader": [{"admin": []}, {"peer": []}],
}

_PARAM: Final = re.compile(r"\{(\w+):[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def openapi_path(route_path: str) -> str:
    """An aiohttp path as OpenAPI writes it: ``/{id:\\d{1,18}}/x`` becomes ``/{id}/x``."""
    return _PARAM.sub(lambda m: "{" + m.group(1) + "}", route_path)


def status_of(kind: str) -> int:
    return REPLIES[kind] if kind in REPLIES else ARRIVING_REPLIES[kind]


def _refusal(kinds: list[str], status: int) -> Schema:
    named = _REFUSAL_HEADERS.get(status, ())
    return {
        "description": f"Refused: {', '.join(kinds)} (the refusal body, docs/protocol.md §9.4).",
        **({"headers": _headers(named)} if named else {}),
        "content": {
            "application/json": {
                "schema": {
                    "allOf": [ref("Refusal"), {"properties": {"error": {"enum": kinds}}}],
                }
            }
        },
    }


def _headers(names: tuple[str, ...]) -> dict[str, Schema]:
    return {n: dict(_HEADERS[n]) for n in names}


def _kinds(op: Operation) -> tuple[str, ...]:
    """The refusals ``op`` can give: its own, the secret's, and masd's own failure."""
    auth = () if op.who == "anyone" or "unauthenticated" in op.refusals else ("unauthenticated",)
    # A known secret on a route not for it: a mode's on the read side, a peer's on an admin's.
    reader = ("forbidden",) if op.who in ("reader", "admin") else ()
    # A path parameter that is not what the path takes (a `/` in it, an id that is not
    # digits) matches no route.
    unrouted = ("not-found",) if "{" in op.path else ()
    return (*auth, *reader, *op.refusals, *unrouted, "unavailable")


def _responses(op: Operation, *, head: bool) -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for a in op.answers:
        answer: Schema = {"description": a.description}
        if a.headers:
            answer["headers"] = _headers(a.headers)
        if a.schema is not None and not head:
            answer["content"] = {a.media: {"schema": a.schema}}
            for media, schema in op.extra_content.get(a.status, {}).items():
                answer["content"][media] = {"schema": schema}
        out[str(a.status)] = answer
    by_status: dict[int, list[str]] = {}
    for kind in _kinds(op):
        by_status.setdefault(status_of(kind), []).append(kind)
    for status, kinds in sorted(by_status.items()):
        refusal = _refusal(kinds, status)
        if head:
            del refusal["content"]
        out[str(status)] = refusal
    return dict(sorted(out.items()))


def _operation(op: Operation, *, head: bool = False) -> Schema:
    name = re.sub(r"[^A-Za-z0-9]+", "_", op.path).strip("_")
    out: Schema = {
        "operationId": f"{'head' if head else op.method.lower()}_{name or 'root'}",
        "summary": op.summary + (" (headers only)" if head else ""),
        "description": op.description
        + (" HEAD answers as GET does, without the body." if head else ""),
        "security": _SECURITY[op.who],
    }
    if op.parameters:
        out["parameters"] = [dict(p) for p in op.parameters]
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": op.body}},
        }
    out["responses"] = _responses(op, head=head)
    return out


def _paths() -> dict[str, dict[str, Schema]]:
    paths: dict[str, dict[str, Schema]] = {}
    for op in OPERATIONS:
        methods = paths.setdefault(op.path, {})
        methods[op.method.lower()] = _operation(op)
        if op.method == "GET":
            methods["head"] = _operation(op, head=True)
    return paths


def _webhooks() -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for mtype, description in OUTBOUND.items():
        out[mtype] = {
            "post": {
                "operationId": "peer_" + mtype.replace(".", "_"),
                "summary": f"{mtype}, from masd to the peer's url",
                "description": description
                + " Sent as a POST to the peer's configured `url` with its Bearer secret; "
                "2xx is done, 4xx is never retried (recorded as a failed delivery), 5xx, "
                "no connection or no answer within `server.peer_timeout` is retried with the "
                "same `id` (docs/protocol.md §10).",
                "security": [{"peer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ref(mtype)}},
                },
                "responses": {
                    "200": {
                        "description": "Done.",
                        "content": {"application/json": {"schema": ref("Ok")}},
                    },
                    "4XX": {
                        "description": "Refused: masd does not send it again.",
                        "content": {"application/json": {"schema": ref("Refusal")}},
                    },
                    "5XX": {"description": "Not processed: masd sends it again with the same id."},
                },
            }
        }
    return out


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "masd HTTP listener",
            "version": __version__,
            "summary": "The email side of the MAS mode contract v0.1: contract messages, the "
            "read side, the outbound queue, health.",
            "description": "docs/protocol.md is the protocol; this document states every path, "
            "parameter, answer and refusal of the listener, and under `webhooks` the messages "
            'masd sends to its peers. Every refusal is `{"ok": false, "error": CODE, '
            '"detail": TEXT}`. Nothing a client sends yields a 5xx: a 503 `unavailable` '
            "(with Retry-After) means masd itself failed. Any other path is 404 `not-found`, "
            "another method 405 `method-not-allowed`.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "servers": [{"url": "http://127.0.0.1:8025", "description": "server.http"}],
        "paths": _paths(),
        "webhooks": _webhooks(),
        "components": {
            "securitySchemes": {
                "admin": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin secret (server.admin_token_file): every "
                    "route but the contract messages.",
                },
                "peer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A peer's secret (the token_file of its endpoint, master or "
                    "webhook entry); it says who the peer is. On the read side, a slave-role "
                    "type's master reads with its own secret, its own types only (another "
                    "type's case or message is answered 404, as one that does not exist); any "
                    "other peer's secret there, and any peer's on an admin route, is 403 "
                    "`forbidden`.",
                },
            },
            "schemas": {**answer_schemas(), **contract_schemas()},
        },
    }


def rendered() -> bytes:
    """The document as served and as kept in docs/openapi.json."""
    return (json.dumps(document(), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def main() -> None:
    """Print the document (``python -m masd.edges.http``)."""
    sys.stdout.buffer.write(rendered())
