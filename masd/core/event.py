"""The gateway event: one inbound mail, normalized (docs/protocol.md §15).

"The ``event`` in ``case.intake`` and ``case.message`` is the normalized
inbound mail ... Decoding is tolerant (unknown fields ignored); encoding is
strict (every field bounded)."

``build_event`` turns raw message bytes into a :class:`GatewayEvent` plus the
trust verdicts the engine needs (:class:`ParsedMail`).  It never refuses mail
for its content: malformed MIME, unknown charsets, 8-bit headers, a missing
From or Message-ID all give an event with empty or ``None`` fields.  The only
:class:`EventError` it raises is for bad *caller* input (``received_at`` not
RFC 3339, an empty or over-long ``message_ref``), code ``invalid-event``; the
same code names every refusal of :meth:`GatewayEvent.from_json`.

The message is read in one pass by :mod:`masd.core.mime`, a small MIME reader
written for this hot path (LMTP: thousands of small messages a second), and an
HTML-only body is turned into text by :mod:`masd.core.htmltext`.  The raw bytes
are only read, never changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from masd.core.errors import EventError
from masd.core.mime import MAX_CONTENT_TYPE, MAX_FILENAME, decode_words, parse_headers
from masd.core.mime import cap as _cap
from masd.core.mime import entity_at as _entity_at
from masd.core.mime import first_of as _first_of  # noqa: F401  (tests read it here)
from masd.core.mime import one_line as _one_line
from masd.core.mime import params as _params  # noqa: F401  (tests read it here)
from masd.core.mime import read_params as _read_params  # noqa: F401  (tests read it here)
from masd.core.mime import split_entity as _split_entity  # noqa: F401  (tests read it here)
from masd.core.mime import split_lines as _split_lines  # noqa: F401  (tests read it here)
from masd.core.mime import split_multipart as _split_multipart  # noqa: F401  (tests read it here)
from masd.core.mime import split_simple as _split_simple  # noqa: F401  (tests read it here)
from masd.core.parts import read_parts
from masd.core.reply import reply_text
from masd.core.rfc5322 import mailboxes, msg_id, msg_ids
from masd.core.trust import (
    AUTOMATION_HEADERS,
    DMARC_RESULTS,
    AuthVerdict,
    Automation,
    TrustCause,
    TrustSettings,
    domain_key,
    read_auth,
    read_automation,
    trust_cause,
)

__all__ = [
    "MAX_ADDRESS",
    "MAX_ATTACHMENTS",
    "MAX_CONTENT_TYPE",
    "MAX_DATE",
    "MAX_FILENAME",
    "MAX_MESSAGE_ID",
    "MAX_MESSAGE_REF",
    "MAX_NAME",
    "MAX_REASON",
    "MAX_REFERENCES",
    "MAX_SUBJECT",
    "MAX_TEXT_BYTES",
    "Attachment",
    "GatewayEvent",
    "ParsedMail",
    "build_event",
    "decode_words",
    "parse_headers",
]

# ---------------------------------------------------------------------------
# Bounds (mirrored as maxLength / maxItems in mas-event-v0.1.schema.json).
# Values over a bound are truncated by build_event and refused by from_json.

MAX_SUBJECT = 998  # RFC 5322 §2.1.1: a line is at most 998 characters
MAX_MESSAGE_ID = 998  # message_id, in_reply_to and each of references
MAX_REFERENCES = 100  # the first (thread root) and the last 99 are kept
MAX_NAME = 256  # from.name
MAX_ADDRESS = 320  # from.address, mail_from, rcpt_to: 64 + "@" + 255
MAX_DATE = 256
MAX_TEXT_BYTES = 256 * 1024  # text: at most 256 KiB of UTF-8
MAX_ATTACHMENTS = 100
MAX_MESSAGE_REF = 256
MAX_REASON = 256  # automated.reason
MAX_AUTHSERV_ID = 255
# MAX_FILENAME and MAX_CONTENT_TYPE are the MIME reader's (masd.core.mime).

_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _refuse(detail: str) -> EventError:
    return EventError(detail, code="invalid-event")


# ---------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class Attachment:
    """Metadata of one attachment; the contents stay with email."""

    filename: str | None
    content_type: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        _check_opt_str("attachments[].filename", self.filename, MAX_FILENAME)
        _check_str("attachments[].content_type", self.content_type, MAX_CONTENT_TYPE)
        if type(self.size) is not int or self.size < 0:
            raise _refuse(f"attachments[].size must be a non-negative integer, not {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256):
            raise _refuse(f"attachments[].sha256 must be 64 lowercase hex digits: {self.sha256!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "content_type": self.content_type,
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class GatewayEvent:
    """The normalized inbound mail (docs/protocol.md §15).  Every field is bounded."""

    message_ref: str
    received_at: str
    mail_from: str
    rcpt_to: str
    message_id: str | None
    in_reply_to: str | None
    references: tuple[str, ...]
    from_address: str
    from_name: str | None
    subject: str
    date: str | None
    text: str
    attachments: tuple[Attachment, ...]
    dmarc: str
    authserv_id: str | None
    automated: bool
    automated_reason: str | None
    #: attachments found beyond the MAX_ATTACHMENTS listed (0: the list is whole)
    attachments_omitted: int = 0
    #: the text less quoted mail, attributions, header blocks, forwards and the
    #: signature (profile §21, masd.core.reply); "" (while ``text`` has words): made
    #: from ``text``, as for an event recorded before the field existed
    reply_text: str = ""

    def __post_init__(self) -> None:
        # "encoding is strict (every field bounded)": an event that exists is valid.
        _check_str("message_ref", self.message_ref, MAX_MESSAGE_REF)
        if not self.message_ref:
            raise _refuse("message_ref must not be empty")
        _check_str("received_at", self.received_at, 64)
        if not _RFC3339.fullmatch(self.received_at):
            raise _refuse(f"received_at is not an RFC 3339 timestamp: {self.received_at!r}")
        _check_str("mail_from", self.mail_from, MAX_ADDRESS)
        _check_str("rcpt_to", self.rcpt_to, MAX_ADDRESS)
        _check_opt_str("message_id", self.message_id, MAX_MESSAGE_ID)
        _check_opt_str("in_reply_to", self.in_reply_to, MAX_MESSAGE_ID)
        if not isinstance(self.references, tuple) or len(self.references) > MAX_REFERENCES:
            raise _refuse(f"references must be a list of at most {MAX_REFERENCES} ids")
        for ref in self.references:
            _check_str("references[]", ref, MAX_MESSAGE_ID)
        _check_str("from.address", self.from_address, MAX_ADDRESS)
        _check_opt_str("from.name", self.from_name, MAX_NAME)
        _check_str("subject", self.subject, MAX_SUBJECT)
        _check_opt_str("date", self.date, MAX_DATE)
        if not isinstance(self.text, str):
            raise _refuse("text must be a string")
        if len(self.text) * 4 > MAX_TEXT_BYTES and _utf8_len(self.text) > MAX_TEXT_BYTES:
            raise _refuse(f"text is over {MAX_TEXT_BYTES} bytes of UTF-8")
        if self.reply_text == "" and isinstance(self.text, str) and self.text:
            # An event recorded before reply_text existed, or built from text
            # alone: the text rules give it (HTML marks are not at hand here).
            object.__setattr__(self, "reply_text", reply_text(self.text))
        if not isinstance(self.reply_text, str):
            raise _refuse("reply_text must be a string")
        if (
            len(self.reply_text) * 4 > MAX_TEXT_BYTES
            and _utf8_len(self.reply_text) > MAX_TEXT_BYTES
        ):
            raise _refuse(f"reply_text is over {MAX_TEXT_BYTES} bytes of UTF-8")
        if not isinstance(self.attachments, tuple) or len(self.attachments) > MAX_ATTACHMENTS:
            raise _refuse(f"attachments must be a list of at most {MAX_ATTACHMENTS} entries")
        for att in self.attachments:
            if not isinstance(att, Attachment):
                raise _refuse("attachments[] must be attachment objects")
        if self.dmarc not in DMARC_RESULTS:
            raise _refuse(f"auth.dmarc must be one of {sorted(DMARC_RESULTS)}: {self.dmarc!r}")
        _check_opt_str("auth.authserv_id", self.authserv_id, MAX_AUTHSERV_ID)
        if not isinstance(self.automated, bool):
            raise _refuse("automated.is must be a boolean")
        _check_opt_str("automated.reason", self.automated_reason, MAX_REASON)
        if type(self.attachments_omitted) is not int or self.attachments_omitted < 0:
            raise _refuse("attachments_omitted must be a non-negative integer")

    def to_json(self) -> dict[str, Any]:
        """The event object exactly as the schema shapes it.

        ``attachments_omitted`` appears only when attachments were left out,
        so a whole list reads as it always has."""
        out: dict[str, Any] = {
            "message_ref": self.message_ref,
            "received_at": self.received_at,
            "mail_from": self.mail_from,
            "rcpt_to": self.rcpt_to,
            "message_id": self.message_id,
            "in_reply_to": self.in_reply_to,
            "references": list(self.references),
            "from": {"address": self.from_address, "name": self.from_name},
            "subject": self.subject,
            "date": self.date,
            "text": self.text,
            "reply_text": self.reply_text,
            "attachments": [a.to_json() for a in self.attachments],
            "auth": {"dmarc": self.dmarc, "authserv_id": self.authserv_id},
            "automated": {"is": self.automated, "reason": self.automated_reason},
        }
        if self.attachments_omitted:
            out["attachments_omitted"] = self.attachments_omitted
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GatewayEvent:
        """Read an event; unknown fields are ignored, missing or bad ones refused."""
        if not isinstance(data, Mapping):
            raise _refuse("event must be an object")
        sender = _obj(data, "from")
        auth = _obj(data, "auth")
        automated = _obj(data, "automated")
        refs = _get(data, "references", "references")
        if not isinstance(refs, list):
            raise _refuse("references must be a list")
        atts = _get(data, "attachments", "attachments")
        if not isinstance(atts, list):
            raise _refuse("attachments must be a list")
        attachments = []
        for i, item in enumerate(atts):
            if not isinstance(item, Mapping):
                raise _refuse(f"attachments[{i}] must be an object")
            attachments.append(
                Attachment(
                    filename=_get(item, "filename", f"attachments[{i}].filename"),
                    content_type=_get(item, "content_type", f"attachments[{i}].content_type"),
                    size=_get(item, "size", f"attachments[{i}].size"),
                    sha256=_get(item, "sha256", f"attachments[{i}].sha256"),
                )
            )
        return cls(
            message_ref=_get(data, "message_ref", "message_ref"),
            received_at=_get(data, "received_at", "received_at"),
            mail_from=_get(data, "mail_from", "mail_from"),
            rcpt_to=_get(data, "rcpt_to", "rcpt_to"),
            message_id=_get(data, "message_id", "message_id"),
            in_reply_to=_get(data, "in_reply_to", "in_reply_to"),
            references=tuple(refs),
            from_address=_get(sender, "address", "from.address"),
            from_name=_get(sender, "name", "from.name"),
            subject=_get(data, "subject", "subject"),
            date=_get(data, "date", "date"),
            text=_get(data, "text", "text"),
            attachments=tuple(attachments),
            dmarc=_get(auth, "dmarc", "auth.dmarc"),
            authserv_id=_get(auth, "authserv_id", "auth.authserv_id"),
            automated=_get(automated, "is", "automated.is"),
            automated_reason=_get(automated, "reason", "automated.reason"),
            attachments_omitted=data.get("attachments_omitted", 0),
            # absent from events recorded before it existed: made from text
            reply_text=data.get("reply_text", ""),
        )


@dataclass(frozen=True)
class ParsedMail:
    """What the engine needs from one inbound mail beyond the event."""

    event: GatewayEvent
    auth: AuthVerdict
    automation: Automation
    #: why the sender is (not) taken as authenticated and not automated
    cause: TrustCause
    #: every address of every From header, domain lowercased (A-labels)
    from_addresses: tuple[str, ...]


def _check_str(field: str, value: object, limit: int) -> None:
    if not isinstance(value, str):
        raise _refuse(f"{field} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise _refuse(f"{field} is longer than {limit} characters")


def _check_opt_str(field: str, value: object, limit: int) -> None:
    if value is not None:
        _check_str(field, value, limit)


def _get(obj: Mapping[str, Any], key: str, field: str) -> Any:
    if key not in obj:
        raise _refuse(f"{field} is missing")
    return obj[key]


def _obj(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = _get(obj, key, key)
    if not isinstance(value, Mapping):
        raise _refuse(f"{key} must be an object")
    return value


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


# ---------------------------------------------------------------------------
# Addresses and ids


def _address_key(address: str) -> str:
    """An address with its domain lowercased in A-label form; the local part kept."""
    local, at, domain = address.rpartition("@")
    if not at:
        return address
    return f"{local}@{domain_key(domain)}"


def _from_fields(values: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """(every From address, display name of the first) from the From headers."""
    addresses: list[str] = []
    first_name: str | None = None
    for value in values:
        for box in mailboxes(value):
            addr = _one_line(box.address)
            if not addr:
                continue
            if not addresses:
                first_name = _cap(_one_line(decode_words(box.name)), MAX_NAME) or None
            addresses.append(_address_key(addr))
    return tuple(addresses), first_name


def _msg_id(value: str | None) -> str | None:
    """The first message id of a header, as ``<id>`` (damaged ones repaired)."""
    if value is None:
        return None
    found = msg_id(_one_line(value))
    return _cap(found, MAX_MESSAGE_ID) if found else None


def _references(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    ids = [_cap(i, MAX_MESSAGE_ID) for i in msg_ids(_one_line(value))]
    if len(ids) > MAX_REFERENCES:
        # Keep the thread root and the most recent ancestors (RFC 5322 §3.6.4).
        ids = [ids[0], *ids[-(MAX_REFERENCES - 1) :]]
    return tuple(ids)


def _envelope(address: str) -> str:
    value = _one_line(address)
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    return _cap(value, MAX_ADDRESS)


# ---------------------------------------------------------------------------
# The event


def _index_headers(headers: Sequence[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """The first value of each header by its lower-case name, and every From value."""
    first: dict[str, str] = {}
    from_values: list[str] = []
    for name, value in headers:
        lname = name.lower()
        if lname == "from":
            from_values.append(value)
        first.setdefault(lname, value)
    return first, from_values


def build_event(
    raw: bytes,
    *,
    mail_from: str,
    rcpt_to: str,
    received_at: str,
    message_ref: str,
    trust: TrustSettings,
) -> ParsedMail:
    """Read one inbound message into a gateway event and its trust verdicts.

    Never refuses the message for its content.  ``EventError`` (code
    ``invalid-event``) only for a bad ``received_at`` or ``message_ref``.
    """
    headers, body = _entity_at(raw, 0, len(raw))
    first, from_values = _index_headers(headers)
    from_addresses, from_name = _from_fields(from_values)
    envelope_from = _envelope(mail_from)
    # read_auth reads only Received and Authentication-Results headers, and
    # read_automation only AUTOMATION_HEADERS: a message with none of them
    # (the common plain mail) gives what an empty list gives.
    auth_headers = headers if "received" in first or "authentication-results" in first else ()
    auth = read_auth(auth_headers, from_addresses, trust)
    auto_headers = headers if not AUTOMATION_HEADERS.isdisjoint(first) else ()
    automation = read_automation(auto_headers, envelope_from)
    cause = trust_cause(auth_headers, auth, automation, trust)

    parts = read_parts(first, raw, body, text_limit=MAX_TEXT_BYTES, limit=MAX_ATTACHMENTS)
    attachments = tuple(Attachment(*listed) for listed in parts.attachments)

    subject = first.get("subject")
    date = first.get("date")
    event = GatewayEvent(
        message_ref=message_ref,
        received_at=received_at,
        mail_from=envelope_from,
        rcpt_to=_cap(_one_line(rcpt_to), MAX_ADDRESS),
        message_id=_msg_id(first.get("message-id")),
        in_reply_to=_msg_id(first.get("in-reply-to")),
        references=_references(first.get("references")),
        from_address=_cap(from_addresses[0], MAX_ADDRESS) if from_addresses else "",
        from_name=from_name,
        subject=_cap(_one_line(decode_words(subject)), MAX_SUBJECT) if subject else "",
        date=(_cap(_one_line(date), MAX_DATE) or None) if date is not None else None,
        text=parts.text,
        reply_text=parts.reply_text,
        attachments=attachments,
        attachments_omitted=parts.omitted,
        dmarc=auth.dmarc,
        authserv_id=_cap(auth.authserv_id, MAX_AUTHSERV_ID) if auth.authserv_id else None,
        automated=automation.is_automated,
        automated_reason=_cap(automation.reason, MAX_REASON) if automation.reason else None,
    )
    return ParsedMail(
        event=event, auth=auth, automation=automation, cause=cause, from_addresses=from_addresses
    )
