"""The messages the kit sends, as email would send them (docs/protocol.md §8).

Every message gets a fresh ``id``; a handoff a fresh ``handoff_id`` and a
case of its own (``<type>=kit-<n>@<domain>``); an intake a fresh
``intake_ref`` and a gateway event (docs/protocol.md §15) with a fresh
``message_ref``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

__all__ = ["Factory"]

_PARTICIPANT = "alice@example.com"


@dataclass
class Factory:
    """Builds the kit's messages; ``status_url`` is the kit's own listener."""

    status_url: str
    mode: str = "callback"
    domain: str = "help.example"
    case_type: str = "ticket"  # the type of the cases handed to a mode
    resource_type: str = "case"  # the slave type whose intakes go to a master
    details: Mapping[str, str] = field(default_factory=dict)
    _cases: int = 0

    def handoff_request(self, subject: str, *, all_details: bool) -> dict[str, Any]:
        self._cases += 1
        address = f"{self.case_type}=kit-{secrets.token_hex(3)}{self._cases}@{self.domain}"
        details = {"subject": subject, **(self.details if all_details else {})}
        return _envelope(
            "handoff.request",
            case={"address": address, "key": address.lower()},
            handoff_id=secrets.token_hex(16),
            mode=self.mode,
            details=details,
            status_url=self.status_url,
            participant={"address": _PARTICIPANT},
        )

    def handoff_update(self, request: Mapping[str, Any], needs: list[str]) -> dict[str, Any]:
        """The answer to ``needs``: every --detail, and a stand-in for any need not given."""
        details = dict(self.details)
        for name in needs:
            details.setdefault(name, f"kit value for {name}")
        return _envelope(
            "handoff.update",
            case=request["case"],
            handoff_id=request["handoff_id"],
            details=details or {"note": "kit update"},
        )

    def handoff_cancel(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return _envelope(
            "handoff.cancel",
            case=request["case"],
            handoff_id=request["handoff_id"],
            reason="timed-out",
        )

    def case_intake(self, subject: str) -> dict[str, Any]:
        rcpt = f"{self.resource_type}@{self.domain}"
        return _envelope(
            "case.intake",
            intake_ref=f"intake-{secrets.token_hex(16)}",
            resource_type=self.resource_type,
            event=self.event(rcpt, subject),
            requested_mode=None,
        )

    def case_message(self, case: Mapping[str, Any], subject: str) -> dict[str, Any]:
        event = self.event(str(case["address"]), subject)
        return _envelope(
            "case.message", case=dict(case), event=event, message_ref=event["message_ref"]
        )

    def event(self, rcpt: str, subject: str) -> dict[str, Any]:
        """A gateway event (docs/protocol.md §15) of a plain mail from the participant."""
        now = datetime.now(UTC)
        return {
            "message_ref": secrets.token_hex(16),
            "received_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "mail_from": _PARTICIPANT,
            "rcpt_to": rcpt,
            "message_id": f"<{secrets.token_hex(8)}@example.com>",
            "in_reply_to": None,
            "references": [],
            "from": {"address": _PARTICIPANT, "name": "Alice"},
            "subject": subject,
            "date": format_datetime(now),
            "text": "Written by masd's peer conformance kit.\n",
            "attachments": [],
            "auth": {"dmarc": "pass", "authserv_id": f"mx.{self.domain}"},
            "automated": {"is": False, "reason": None},
        }


def _envelope(mtype: str, **fields: Any) -> dict[str, Any]:
    return {"mas_modes_version": "0.1", "type": mtype, "id": secrets.token_hex(16), **fields}
