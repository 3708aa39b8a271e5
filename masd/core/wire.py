"""Contract messages on the wire (docs/protocol.md §7, §8; docs/protocol.md §9).

Decoding is strict about what masd acts on and tolerant of the rest: unknown
fields are ignored, every known field is checked for type and bounds, and a
refusal names the field and the value (docs/protocol.md §9: "names the field or value
refused").  Encoding builds the exact JSON masd sends.

The checks run in docs/protocol.md §9's order, split where the edge must step in:

1. :func:`parse_envelope` -- not JSON or no envelope (``invalid-message``),
   ``unsupported-version``, ``unknown-type``.  The JSON itself is read by
   :func:`loads`, which refuses what masd could not keep or send on
   faithfully: nesting deeper than :data:`MAX_DEPTH`, an integer outside
   ±2^53 (what every JSON reader holds exactly, RFC 8259 §6), a string with
   an unpaired surrogate (not Unicode text, RFC 8259 §8.2) or a NUL, a key
   given twice in one object (RFC 8259 §4: names SHOULD be unique);
2. the edge checks the peer may send that type (``forbidden``) and looks up
   idempotency by (peer, ``id``);
3. :func:`decode` -- schema, bounds and the case key (``invalid-message``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from masd.core.address import check_case_ref, check_id_grammar
from masd.core.errors import AddressError, WireError
from masd.core.status import MACHINE

VERSION: Final = "0.1"

#: Every message type of docs/protocol.md §8, with the parties that send it.
TYPES: Final = {
    "handoff.request": "email",
    "handoff.update": "email",
    "handoff.cancel": "email|master",
    "handoff.status": "mode|email",
    "case.intake": "email",
    "case.assign": "master",
    "case.message": "email",
    "case.policy": "master",
    "handoff.requested": "email",
    "mail.send": "master",
}

#: What each kind of peer may send to email (docs/protocol.md §9: "a mode may post
#: statuses only ...; a master may send only master messages").
MAY_SEND: Final = {
    "mode": frozenset({"handoff.status"}),
    "webhook": frozenset({"handoff.status"}),
    "master": frozenset({"case.assign", "case.policy", "mail.send", "handoff.cancel"}),
}

#: docs/protocol.md §7: "case ... Absent only in case.intake and case.assign."
_NO_CASE: Final = frozenset({"case.intake", "case.assign"})

REFUSE_REASONS: Final = frozenset(
    {"mode-unavailable", "mode-not-enabled", "declined", "out-of-hours", "blocked"}
)

# Bounds (docs/protocol.md §9 and §15: "every field bounded").
MAX_ID: Final = 128
MAX_TOKEN: Final = 64  # statuses, reasons, outcomes, field names
MAX_DETAIL: Final = 1024
MAX_NEEDS: Final = 32
MAX_SUBJECT: Final = 998
MAX_BODY: Final = 200_000
MAX_URL: Final = 2048
MAX_SEQ: Final = 2**53 - 1
#: docs/protocol.md §9: JSON nested deeper than this is refused (the top object is level 1).
MAX_DEPTH: Final = 32
#: docs/protocol.md §9: integers outside ±2^53 are refused.
MAX_INT: Final = 2**53

_ID_RE: Final = re.compile(r"[\x21-\x7e]{1,128}")
_FIELD_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_RFC3339_RE: Final = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


@dataclass(frozen=True)
class CaseRef:
    """The envelope's ``case``: canonical resource address and equivalence key."""

    address: str
    key: str

    def to_json(self) -> dict[str, str]:
        return {"address": self.address, "key": self.key}


@dataclass(frozen=True)
class Envelope:
    """A message whose envelope passed the first checks; ``body`` is the whole object."""

    type: str
    id: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class HandoffStatus:
    id: str
    case: CaseRef
    handoff_id: str
    seq: int
    status: str
    needs: tuple[str, ...] | None = None
    at: str | None = None
    outcome: str | None = None
    reason: str | None = None
    detail: str | None = None

    def fields(self) -> dict[str, Any]:
        """The status's own fields, as recorded and relayed (None left out)."""
        out: dict[str, Any] = {}
        if self.needs is not None:
            out["needs"] = list(self.needs)
        for name in ("at", "outcome", "reason", "detail"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass(frozen=True)
class HandoffCancel:
    id: str
    case: CaseRef
    handoff_id: str
    reason: str


@dataclass(frozen=True)
class PolicyPatch:
    """Policy fields a master set; ``None`` means "not set, keep the current value"."""

    autonomous_send: bool | None = None
    transfers: str | None = None  # "block" or a webhook URL


@dataclass(frozen=True)
class CaseAssign:
    id: str
    intake_ref: str
    resource_id: str
    policy: PolicyPatch | None


@dataclass(frozen=True)
class CasePolicy:
    id: str
    case: CaseRef
    policy: PolicyPatch


@dataclass(frozen=True)
class MailSend:
    id: str
    case: CaseRef
    in_reply_to: str
    subject: str | None
    body: str


Inbound = HandoffStatus | HandoffCancel | CaseAssign | CasePolicy | MailSend


def _bad(detail: str) -> WireError:
    return WireError(detail, code="invalid-message")


class _Duplicated(dict[str, Any]):
    """An object in which ``key`` was given twice (refused by :func:`_check`)."""

    key: str = ""


@dataclass(frozen=True)
class _BigInt:
    """An integer literal too long to be within ±2^53 (never converted)."""

    digits: str


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = dict(pairs)
    if len(out) == len(pairs):
        return out
    duplicated = _Duplicated(out)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            duplicated.key = key
            break
        seen.add(key)
    return duplicated


def _int(text: str) -> int | _BigInt:
    # 2^53 has 16 digits: a longer literal is out of range, and converting a
    # huge one would cost time (or raise past Python's 4300-digit limit).
    return int(text) if len(text.lstrip("-")) <= 16 else _BigInt(text)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")

#: A string holds a NUL or a surrogate only as an escape (RFC 8259 §7: a raw
#: control character is not JSON, and UTF-8 decoding refused an encoded surrogate).
_SUSPECT_ESCAPE: Final = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


class _Walk(Exception):
    """The screen of :func:`loads` cannot vouch for the text: walk it."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Walk
    return out


def _short_int(text: str) -> int:
    if len(text) > 15:  # 15 characters are within ±2^53, which has 16 digits
        raise _Walk
    return int(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Walk
    return value


_SCREENED: Final = json.JSONDecoder(
    object_pairs_hook=_unique, parse_int=_short_int, parse_float=_finite, parse_constant=_constant
)


def loads(raw: bytes) -> Any:
    """The JSON value in ``raw`` (UTF-8), within docs/protocol.md §9's bounds.

    ``invalid-message`` names the field at fault: ``body`` for what is not
    JSON or is nested too deep, else the field's path (``case.key``,
    ``needs[2]``).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"body: not JSON (not UTF-8: {exc.reason} at byte {exc.start})") from exc
    # Most messages need no walk of their values: no string escape could give a
    # NUL or a surrogate, no key is given twice, every number is short or finite
    # (_SCREENED's hooks), and there are no more objects and arrays than
    # MAX_DEPTH, so none is nested deeper.  Anything else, and every refusal,
    # is the walk's (_walked).
    if _SUSPECT_ESCAPE.search(text) is None and text.count("{") + text.count("[") <= MAX_DEPTH:
        try:
            return _SCREENED.decode(text)
        except (_Walk, ValueError):
            pass
    return _walked(text)


def _walked(text: str) -> Any:
    """:func:`loads` for a text its screen did not pass: parsed, then every value checked."""
    try:
        value = json.loads(
            text, object_pairs_hook=_object, parse_int=_int, parse_constant=_constant
        )
    except RecursionError as exc:  # far deeper than MAX_DEPTH
        raise _bad(f"body: JSON nested deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:
        raise _bad(f"body: not JSON ({exc})") from exc
    _check(value, "", 1)
    return value


def _check(value: Any, path: str, depth: int) -> None:
    """Refuse what :func:`loads` must not return (see its docstring)."""
    if isinstance(value, str):
        _check_text(value, path or "body")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            raise _bad(f"{path or 'body'}: the integer {value} is outside ±2^53")
    elif isinstance(value, _BigInt):
        shown = value.digits if len(value.digits) <= 24 else value.digits[:20] + "..."
        raise _bad(
            f"{path or 'body'}: the integer {shown} ({len(value.digits)} characters) "
            "is outside ±2^53"
        )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _bad(f"{path or 'body'}: a number too large for a double")
    elif depth > MAX_DEPTH:
        top = re.split(r"[.\[]", path, maxsplit=1)[0]  # the message's own field
        raise _bad(f"{top or 'body'}: JSON nested deeper than {MAX_DEPTH} levels")
    elif isinstance(value, dict):
        if isinstance(value, _Duplicated):
            raise _bad(f"{_field(path, value.key)}: given twice in one object")
        for key, item in value.items():
            _check_text(key, f"{_field(path, key)} (the name)")
            _check(item, _field(path, key), depth + 1)
    else:
        for index, item in enumerate(value):
            _check(item, f"{path or 'body'}[{index}]", depth + 1)


def _field(path: str, key: str) -> str:
    shown = key if _ID_RE.fullmatch(key) and len(key) <= 64 else json.dumps(key[:64])
    return f"{path}.{shown}" if path else shown


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise _bad(f"{where}: a string with a NUL character")
    if not text.isascii() and _LONE_SURROGATE.search(text):
        raise _bad(f"{where}: a string with an unpaired surrogate (not Unicode text)")


def parse_envelope(raw: bytes) -> Envelope:
    """Check that ``raw`` is a JSON object with a v0.1 envelope of a known type."""
    body = loads(raw)
    if not isinstance(body, dict):
        raise _bad(f"body: a JSON {type(body).__name__}, not an object")
    for name in ("mas_modes_version", "type", "id"):
        if name not in body:
            raise _bad(f"{name}: missing (every message carries the envelope, docs/protocol.md §7)")
    version = body["mas_modes_version"]
    if version != VERSION:
        raise WireError(
            f"mas_modes_version: {json.dumps(version)} is not {json.dumps(VERSION)}",
            code="unsupported-version",
        )
    mtype = body["type"]
    if not isinstance(mtype, str) or mtype not in TYPES:
        raise WireError(
            f"type: {json.dumps(mtype)} is not a message type of docs/protocol.md §8",
            code="unknown-type",
        )
    return Envelope(type=mtype, id=_id(body, "id"), body=body)


def check_may_send(peer_kind: str, envelope: Envelope) -> None:
    """``forbidden`` unless a peer of this kind may send this type to email."""
    if envelope.type not in MAY_SEND.get(peer_kind, frozenset()):
        raise WireError(
            f"type: a {peer_kind} may not send {envelope.type} to email", code="forbidden"
        )


def decode(envelope: Envelope) -> Inbound:
    """Decode and bound-check a message email receives; ``invalid-message`` names the field."""
    b = envelope.body
    case = None if envelope.type in _NO_CASE else _case(b)
    match envelope.type:
        case "handoff.status":
            assert case is not None
            return _status(envelope.id, case, b)
        case "handoff.cancel":
            assert case is not None
            return HandoffCancel(envelope.id, case, _id(b, "handoff_id"), _token(b, "reason"))
        case "case.assign":
            if "case" in b:
                raise _bad("case: not allowed in case.assign (docs/protocol.md §7)")
            policy = _policy(b["policy"], "policy") if b.get("policy") is not None else None
            resource_id = _str(b, "resource_id", 64)
            try:
                # The grammar is a schema fault (invalid-message before unknown-intake,
                # docs/protocol.md §9); the 47-octet bound needs the intake's type and
                # comes later.
                check_id_grammar(resource_id)
            except AddressError as exc:
                raise _bad(f"resource_id: {exc.detail}") from exc
            return CaseAssign(envelope.id, _id(b, "intake_ref"), resource_id, policy)
        case "case.policy":
            assert case is not None
            return CasePolicy(envelope.id, case, _policy(b, ""))
        case "mail.send":
            assert case is not None
            subject = _opt_str(b, "subject", MAX_SUBJECT)
            return MailSend(
                envelope.id, case, _id(b, "in_reply_to"), subject, _str(b, "body", MAX_BODY)
            )
    raise WireError(f"type: email does not receive {envelope.type}", code="forbidden")


def _status(mid: str, case: CaseRef, b: Mapping[str, Any]) -> HandoffStatus:
    seq = b.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise _bad(f"seq: {json.dumps(seq)} is not an integer from 0 to 2^53-1")
    status = _token(b, "status")
    if status not in MACHINE.statuses:
        raise _bad(f'status: "{status}" is not a status of docs/protocol.md §14')
    needs = None
    if b.get("needs") is not None:
        raw = b["needs"]
        if not isinstance(raw, list) or len(raw) > MAX_NEEDS:
            raise _bad(f"needs: not a list of at most {MAX_NEEDS} field names")
        for item in raw:
            if not isinstance(item, str) or not _FIELD_RE.fullmatch(item):
                raise _bad(f"needs: {json.dumps(item)} is not a field name")
        needs = tuple(item.lower() for item in raw)
    at = _opt_str(b, "at", 64)
    if at is not None and not _RFC3339_RE.fullmatch(at):
        raise _bad(f"at: {json.dumps(at)} is not an RFC 3339 date-time")
    reason = _opt_str(b, "reason", MAX_TOKEN)
    if status == "refused" and reason not in REFUSE_REASONS:
        raise _bad(
            f"reason: {json.dumps(reason)} is not one of " + ", ".join(sorted(REFUSE_REASONS))
        )
    return HandoffStatus(
        id=mid,
        case=case,
        handoff_id=_id(b, "handoff_id"),
        seq=seq,
        status=status,
        needs=needs,
        at=at,
        outcome=_opt_str(b, "outcome", MAX_TOKEN),
        reason=reason,
        detail=_opt_str(b, "detail", MAX_DETAIL),
    )


def _policy(raw: Any, where: str) -> PolicyPatch:
    prefix = f"{where}." if where else ""
    if not isinstance(raw, dict):
        raise _bad(f"{where or 'policy'}: not an object")
    autonomous = raw.get("autonomous_send")
    if autonomous is not None and not isinstance(autonomous, bool):
        raise _bad(f"{prefix}autonomous_send: {json.dumps(autonomous)} is not true or false")
    transfers = raw.get("transfers")
    url: str | None = None
    if transfers is not None:
        if transfers == "block":
            url = "block"
        elif isinstance(transfers, dict) and isinstance(transfers.get("webhook"), str):
            url = transfers["webhook"]
            if len(url) > MAX_URL or not re.match(r"(?i)https?://[^\s]+\Z", url):
                raise _bad(
                    f"{prefix}transfers.webhook: {json.dumps(url)[:200]} is not an http(s) URL"
                )
        else:
            raise _bad(
                f"{prefix}transfers: {json.dumps(transfers)[:200]} "
                'is not "block" or {"webhook": URL}'
            )
    return PolicyPatch(autonomous, url)


def _case(b: Mapping[str, Any]) -> CaseRef:
    # docs/protocol.md §2: "a receiver refuses a message whose key does not match its
    # address (invalid-message)".
    raw = b.get("case")
    if not isinstance(raw, dict):
        raise _bad("case: missing or not an object {address, key}")
    try:
        addr = check_case_ref(raw)
    except AddressError as exc:
        raise _bad(f"case.{exc.detail}") from exc
    return CaseRef(addr.canonical, addr.key)


def _id(b: Mapping[str, Any], name: str) -> str:
    value = b.get(name)
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise _bad(
            f"{name}: {json.dumps(value)[:200]} is not 1 to {MAX_ID} printable ASCII characters"
        )
    return value


def _str(b: Mapping[str, Any], name: str, limit: int) -> str:
    value = b.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"{name}: missing or not a non-empty string")
    if len(value) > limit:
        raise _bad(f"{name}: {len(value)} characters, over {limit}")
    return value


def _opt_str(b: Mapping[str, Any], name: str, limit: int) -> str | None:
    return None if b.get(name) is None else _str(b, name, limit)


def _token(b: Mapping[str, Any], name: str) -> str:
    return _str(b, name, MAX_TOKEN)


def envelope(mtype: str, mid: str, case: CaseRef | None, **payload: Any) -> dict[str, Any]:
    """Build a message email sends: envelope first, then the payload (None left out)."""
    out: dict[str, Any] = {"mas_modes_version": VERSION, "type": mtype, "id": mid}
    if case is not None:
        out["case"] = case.to_json()
    out.update({k: v for k, v in payload.items() if v is not None})
    return out
