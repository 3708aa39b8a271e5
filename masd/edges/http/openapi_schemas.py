"""The shapes of the OpenAPI document (:mod:`masd.edges.http.openapi`): the contract's JSON
Schemas bundled from ``conformance/schema``, and the answers of the listener's own routes.

The contract's schemas stay one source, in ``conformance/schema``: each file becomes one
component (named by the message type, ``envelope`` or ``mas-event-v0.1``) and each of its
``$defs`` a component of its own (``envelope.id``, ``envelope.case``, ...).  ``$id`` and
``$schema`` are dropped and every ``$ref`` between files, or into a file's ``$defs``, is
rewritten to point into ``#/components/schemas``, so a client resolves every reference from
the document alone.

The answers of the read side, the queue, health and the refusals are written here, as the
read side builds them (:mod:`masd.read.case_views`, :mod:`masd.read.feed`,
:mod:`masd.read.queue_items`).  They allow fields they do not name, as the contract's do.
"""

from __future__ import annotations

import json
from typing import Any, Final

from masd._resources import conformance_dir

#: The file name of each contract schema, and the component it becomes.
_SUFFIX: Final = ".schema.json"
COMPONENTS: Final = "#/components/schemas/"

Schema = dict[str, Any]


def _name(file: str) -> str:
    return file.removesuffix(_SUFFIX)


def _ref_target(ref: str, file: str) -> str:
    """``ref`` as found in ``file``, pointing into the bundled components."""
    target, _, pointer = ref.partition("#")
    name = _name(target) if target else _name(file)
    if not pointer:
        return COMPONENTS + name
    parts = pointer.strip("/").split("/")
    if len(parts) != 2 or parts[0] != "$defs":
        raise ValueError(f"{file}: $ref {ref} points where the bundle cannot follow")
    return COMPONENTS + f"{name}.{parts[1]}"


def _rewrite(node: Any, file: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in ("$id", "$schema", "$defs"):
                continue
            out[key] = _ref_target(value, file) if key == "$ref" else _rewrite(value, file)
        return out
    if isinstance(node, list):
        return [_rewrite(item, file) for item in node]
    return node


def contract_schemas() -> dict[str, Schema]:
    """Every schema of ``conformance/schema``, as components with their refs rewritten."""
    out: dict[str, Schema] = {}
    for path in sorted((conformance_dir() / "schema").glob("*" + _SUFFIX)):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = _name(path.name)
        out[name] = _rewrite(doc, path.name)
        for def_name, value in doc.get("$defs", {}).items():
            out[f"{name}.{def_name}"] = _rewrite(value, path.name)
    return out


def ref(name: str) -> Schema:
    return {"$ref": COMPONENTS + name}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_STR: Final[Schema] = {"type": "string"}
_INT: Final[Schema] = {"type": "integer"}
_TIME: Final[Schema] = {"type": "string", "description": "RFC 3339, UTC"}
_NTIME: Final[Schema] = {"type": ["string", "null"], "description": "RFC 3339, UTC, or null"}
_NSTR: Final[Schema] = {"type": ["string", "null"]}


def _obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


#: Thread entry kinds (docs/protocol.md §16.2).
ENTRY_KINDS: Final = (
    "mail.in",
    "mail.out",
    "mail.refused",
    "mail.bounced",
    "status",
    "contract.in",
    "contract.out",
    "delivery.failed",
    "case.erased",
)

_CASE_REF: Final = _obj({"address": _STR, "key": _STR})

_DELIVERY: Final = _obj(
    {
        "state": {"enum": ["queued", "retrying", "sent", "failed", "bounced"]},
        "attempts": {"type": ["integer", "null"]},
        "last_error": _NSTR,
        "next_attempt_at": _NTIME,
        "done_at": _NTIME,
    }
)

_ENTRY: Final = _obj(
    {"seq": _INT, "kind": {"enum": list(ENTRY_KINDS)}, "at": _TIME},
    {"delivery": ref("Delivery")},
)

_HANDOFF: Final = _obj(
    {
        "handoff_id": _STR,
        "mode": _STR,
        "status": _STR,
        "seq": {"type": ["integer", "null"]},
        "peer": _NSTR,
        "requested_at": _NTIME,
        "deadline_at": _NTIME,
        "closed_at": _NTIME,
        "forwarded": {"type": "boolean"},
        "webhook_url": _NSTR,
        "details": {"type": "object"},
    }
)

_ROLE: Final[Schema] = {"enum": ["master", "slave"]}

_CASE: Final = _obj(
    {
        "address": _STR,
        "key": _STR,
        "domain": _STR,
        "type": _STR,
        "id": _STR,
        "role": _ROLE,
        "participant": _NSTR,
        "created_at": _NTIME,
        "policy": {"type": ["object", "null"]},
        "entries": _INT,
        "sent": _INT,
        "handoffs": {"type": "array", "items": ref("Handoff")},
    }
)

_CASE_ITEM: Final = _obj(
    {
        "address": _STR,
        "key": _STR,
        "domain": _STR,
        "type": _STR,
        "role": _ROLE,
        "participant": _NSTR,
        "opened_at": _NTIME,
        "last_activity_at": _NTIME,
        "open_handoff": nullable(_obj({"handoff_id": _STR, "mode": _STR, "status": _STR})),
    }
)

_ITEM: Final = _obj(
    {
        "id": _INT,
        "kind": {"enum": ["mail", "contract"]},
        "case": _NSTR,
        "peer": _STR,
        "state": {"enum": ["queued", "retrying", "sent", "failed"]},
        "attempts": _INT,
        "last_error": _NSTR,
        "created_at": _NTIME,
        "next_attempt_at": _NTIME,
        "done_at": _NTIME,
    },
    {"type": _NSTR, "message_id": _NSTR, "to": _NSTR, "subject": _NSTR},
)

_OK: Final[Schema] = {"const": True}

_MESSAGE: Final = _obj(
    {
        "message_ref": _STR,
        "case": nullable(ref("CaseRef")),
        "intake_ref": _NSTR,
        "received_at": _TIME,
        "size": _INT,
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "event": ref("mas-event-v0.1"),
    }
)

_INTAKE: Final = _obj(
    {
        "intake_ref": _STR,
        "domain": _STR,
        "type": _STR,
        "message_ref": _STR,
        "requested_mode": _NSTR,
        "created_at": _TIME,
        "assigned_at": _NTIME,
        "case": nullable(ref("CaseRef")),
    }
)


def answer_schemas() -> dict[str, Schema]:
    """The answers of masd's own routes, by component name."""
    return {
        "Refusal": {
            "type": "object",
            "description": "Every refusal (docs/protocol.md §9.4): what was refused and why.",
            "required": ["ok", "error", "detail"],
            "properties": {
                "ok": {"const": False},
                "error": _STR,
                "detail": {"type": "string", "description": "names the field or value refused"},
                "reason": {
                    "type": "string",
                    "description": "with error refused (mail.send under Principle 10)",
                },
            },
        },
        "Ok": _obj({"ok": _OK}),
        "MessageAnswer": _obj(
            {"ok": _OK},
            {
                "ignored": {"enum": ["stale", "not-forwarded"]},
                "sent": {"const": True},
                "case": ref("CaseRef"),
            },
        ),
        "CaseRef": _CASE_REF,
        "Delivery": _DELIVERY,
        "Entry": _ENTRY,
        "Handoff": _HANDOFF,
        "Case": _obj({"case": _CASE}),
        "Thread": _obj({"entries": {"type": "array", "items": ref("Entry")}, "next": _INT}),
        "CaseList": _obj(
            {"cases": {"type": "array", "items": _CASE_ITEM}, "next": _NSTR},
        ),
        "Events": _obj(
            {
                "events": {
                    "type": "array",
                    "items": _obj({"cursor": _STR, "case": ref("CaseRef"), "entry": ref("Entry")}),
                },
                "next": _STR,
            }
        ),
        "QueueItem": _ITEM,
        "Queue": _obj({"items": {"type": "array", "items": ref("QueueItem")}}),
        "Retried": _obj({"ok": _OK, "retried": {"type": "array", "items": _INT}}),
        "ItemChanged": _obj({"ok": _OK, "item": ref("QueueItem")}),
        "Message": _obj({"message": _MESSAGE}),
        "Intakes": _obj({"intakes": {"type": "array", "items": _INTAKE}, "next": _STR}),
        "Resent": _obj({"ok": _OK, "intake_ref": _STR, "id": _STR, "outbox_id": _INT}),
        "Erased": _obj({"ok": _OK, "erased": {"type": "object", "additionalProperties": _INT}}),
        "OpenApi": {"type": "object", "required": ["openapi"], "properties": {"openapi": _STR}},
    }
