"""The MCP edge's tools: their names, descriptions and input schemas, and who is shown each
(docs/protocol.md §23).

A reading tool is shown to a caller the read side lets read (the admin, a master for its
own types); an acting tool to a caller the HTTP POST takes its message type from
(:data:`masd.core.wire.MAY_SEND`).  No schema has a field for the caller or the sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from masd.edges.mcp_acts import ACTS
from masd.edges.mcp_caller import Caller
from masd.edges.mcp_reads import MAX_FILTER, MAX_WAIT

_CASE: Final = {
    "type": "object",
    "description": "The case as the contract names it: its address and key (read_case gives both)",
    "properties": {
        "address": {"type": "string", "maxLength": 320},
        "key": {"type": "string", "maxLength": 320},
    },
    "required": ["address", "key"],
}
_ID: Final = {
    "type": "string",
    "maxLength": 128,
    "description": "The message's id (idempotency key); by default one derived from the arguments",
}
_POLICY: Final = {
    "autonomous_send": {"type": "boolean"},
    "transfers": {
        "description": '"block" or {"webhook": URL}',
        "anyOf": [{"const": "block"}, {"type": "object"}],
    },
}


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    schema: dict[str, Any]
    #: "read": a reader's; else the contract message type it sends.
    needs: str

    def shown_to(self, caller: Caller) -> bool:
        if self.needs == "read":
            return caller.reader is not None
        return caller.may_send(self.needs)


TOOLS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec(
        "list_cases",
        "The cases this secret may read, latest activity first, a page at a time "
        "(as GET /mas/v0.1/cases).",
        _schema(
            {
                "state": {"enum": ["open", "closed"]},
                "participant": {"type": "string", "maxLength": MAX_FILTER},
                "domain": {"type": "string", "maxLength": MAX_FILTER},
                "after": {"type": "string", "description": "The previous page's next"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            }
        ),
        "read",
    ),
    ToolSpec(
        "read_case",
        "One case (its address, key, role, policy, handoffs) and a page of its thread.",
        _schema(
            {
                "key": {"type": "string", "description": "The case's key or address"},
                "after": {"type": "integer", "minimum": 0, "description": "Thread seq"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            },
            ("key",),
        ),
        "read",
    ),
    ToolSpec(
        "read_message",
        "A mail as masd read it: its event (from, subject, text, reply_text: the new text "
        "without the quoted thread, attachments).",
        _schema({"message_ref": {"type": "string", "maxLength": 128}}, ("message_ref",)),
        "read",
    ),
    ToolSpec(
        "read_attachment",
        "Attachment n of a mail (from 0, as read_message lists them): inline up to 512 KiB, "
        "else a link to its HTTP route.",
        _schema(
            {"message_ref": {"type": "string", "maxLength": 128}, "n": {"type": "integer"}},
            ("message_ref", "n"),
        ),
        "read",
    ),
    ToolSpec(
        "wait_events",
        f"The events after a cursor that this secret may read, held up to {MAX_WAIT} s until "
        "there is one; go on from next.",
        _schema(
            {
                "after": {"type": "string", "description": "The previous call's next"},
                "case": {"type": "string", "description": "Only this case's (key or address)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
                "wait": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT},
            }
        ),
        "read",
    ),
    ToolSpec(
        "assign_case",
        "Open a case from a pending intake (case.assign).",
        _schema(
            {
                "intake_ref": {"type": "string", "maxLength": 128},
                "resource_id": {"type": "string", "maxLength": 64},
                "policy": {"type": "object", "properties": _POLICY},
                "id": _ID,
            },
            ("intake_ref", "resource_id"),
        ),
        ACTS["assign_case"][0],
    ),
    ToolSpec(
        "send_mail",
        "Answer a case's mail (mail.send): masd writes and sends it from the case's address.",
        _schema(
            {
                "case": _CASE,
                "in_reply_to": {"type": "string", "maxLength": 128, "description": "A message_ref"},
                "subject": {"type": "string", "maxLength": 998},
                "body": {"type": "string", "maxLength": 200000},
                "id": _ID,
            },
            ("case", "in_reply_to", "body"),
        ),
        ACTS["send_mail"][0],
    ),
    ToolSpec(
        "set_policy",
        "Change a case's policy (case.policy).",
        _schema({"case": _CASE, **_POLICY, "id": _ID}, ("case",)),
        ACTS["set_policy"][0],
    ),
    ToolSpec(
        "post_status",
        "Report on a handoff sent to this endpoint (handoff.status), seq one more each time.",
        _schema(
            {
                "case": _CASE,
                "handoff_id": {"type": "string", "maxLength": 128},
                "seq": {"type": "integer", "minimum": 0},
                "status": {"type": "string", "maxLength": 64},
                "needs": {"type": "array", "items": {"type": "string"}, "maxItems": 32},
                "at": {"type": "string"},
                "outcome": {"type": "string", "maxLength": 64},
                "reason": {"type": "string", "maxLength": 64},
                "detail": {"type": "string", "maxLength": 1024},
                "id": _ID,
            },
            ("case", "handoff_id", "seq", "status"),
        ),
        ACTS["post_status"][0],
    ),
)

BY_NAME: Final = {tool.name: tool for tool in TOOLS}


def tools_for(caller: Caller) -> list[ToolSpec]:
    """What ``caller`` is shown, and may call."""
    return [tool for tool in TOOLS if tool.shown_to(caller)]
