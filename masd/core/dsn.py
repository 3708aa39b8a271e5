"""Is this mail a bounce, and what does it say (docs/protocol.md §22)?

A delivery status notification (RFC 3464: ``multipart/report;
report-type=delivery-status``) is read here field by field: each
per-recipient block's ``Action``, ``Status``, ``Final-Recipient``,
``Diagnostic-Code`` and ``Remote-MTA``.  A bounce in one of the common
non-standard forms (qmail, Exim, Exchange, old Postfix, Yahoo, ...) is found
by Mailman's detectors (``flufl.bounce``), which name the failed recipients;
its status is the first enhanced status code (RFC 3463) its text gives, or
``5.0.0`` / ``4.0.0`` when it gives none.

Decisions: the first failed recipient of a report is the one reported (masd
sends each mail to one recipient); a report whose recipients were all
delivered, relayed or expanded is not a bounce; the recipient is the
``Original-Recipient`` when there is one (the address masd sent to), else the
``Final-Recipient``; a failure is permanent
exactly when its status is ``5.x.x``, whatever its ``Action`` says.
"""

from __future__ import annotations

import email
import re
from dataclasses import dataclass
from email.message import Message
from typing import Final

from flufl.bounce import all_failures

__all__ = ["BounceReport", "read_bounce"]

#: How much of a mail is read: a bounce puts its report before the returned message.
READ_BYTES: Final = 1024 * 1024
#: How much of a mail the non-standard detectors read.  They run their patterns over
#: every line (flufl.bounce's ``simplematch``: about 50 µs a line, so 16 KiB of blank
#: lines cost a second), and the bounces they know say who failed in their first lines.
HEURISTIC_BYTES: Final = 32 * 1024
MAX_DIAGNOSTIC: Final = 1000
MAX_MTA: Final = 255
MAX_RECIPIENT: Final = 320
_STATUS_RE = re.compile(r"\b([245])\.(\d{1,3})\.(\d{1,3})\b")
_FAILED = ("fail", "error")  # opensmtpd writes "error"


@dataclass(frozen=True, slots=True)
class BounceReport:
    """One failed (or delayed) delivery a bounce reports."""

    recipient: str | None
    status: str
    diagnostic: str | None
    remote_mta: str | None

    @property
    def permanent(self) -> bool:
        return self.status.startswith("5")

    def to_json(self) -> dict[str, str | None]:
        return {
            "recipient": self.recipient,
            "status": self.status,
            "diagnostic": self.diagnostic,
            "remote_mta": self.remote_mta,
        }

    @classmethod
    def from_json(cls, data: dict[str, str | None]) -> BounceReport:
        """The report :meth:`to_json` wrote (another process's reading)."""
        status = data.get("status")
        if not isinstance(status, str) or not _STATUS_RE.fullmatch(status):
            raise ValueError(f"bounce report: status {status!r} is no RFC 3463 code")
        fields = (data.get(k) for k in ("recipient", "diagnostic", "remote_mta"))
        recipient, diagnostic, remote_mta = (v if isinstance(v, str) else None for v in fields)
        return cls(
            _clip(recipient, MAX_RECIPIENT),
            status,
            _clip(diagnostic, MAX_DIAGNOSTIC),
            _clip(remote_mta, MAX_MTA),
        )


def _clip(text: str | None, limit: int) -> str | None:
    if text is None:
        return None
    text = " ".join(str(text).split())
    return text[:limit] or None


def _typed(field: str | None) -> str | None:
    """The value of a typed field (``rfc822; a@b``, ``dns; mx.example``)."""
    if field is None:
        return None
    kind, semi, rest = str(field).partition(";")
    return (rest if semi else kind).strip() or None


def _status(text: str | None, default: str) -> str:
    m = _STATUS_RE.search(text or "")
    return m.group(0) if m else default


def _block_report(block: Message) -> BounceReport | None:
    action = str(block.get("action", "")).strip().lower()
    if action.startswith("delayed"):
        default = "4.0.0"
    elif action.startswith(_FAILED):
        default = "5.0.0"
    else:
        return None
    status = _status(str(block.get("status", "")), default)
    if status.startswith("2"):
        status = default
    # The Original-Recipient is the address masd sent to; the Final-Recipient
    # may be what a forwarder or a rewrite made of it.
    recipient = _typed(block.get("original-recipient")) or _typed(block.get("final-recipient"))
    if recipient is not None:
        recipient = recipient.strip("<>").strip() or None
    return BounceReport(
        _clip(recipient, MAX_RECIPIENT),
        status,
        _clip(block.get("diagnostic-code"), MAX_DIAGNOSTIC),
        _clip(_typed(block.get("remote-mta")), MAX_MTA),
    )


def _from_report(msg: Message) -> BounceReport | None:
    """The first failed recipient of an RFC 3464 report, else its first delayed one."""
    delayed: BounceReport | None = None
    for part in msg.walk():
        if part.get_content_type() != "message/delivery-status" or not part.is_multipart():
            continue
        payload = part.get_payload()
        blocks = payload if isinstance(payload, list) else []
        for block in blocks[1:]:  # the first block is the per-message fields
            if not isinstance(block, Message):
                continue
            found = _block_report(block)
            if found is not None and found.permanent:
                return found
            if found is not None and delayed is None:
                delayed = found
    return delayed


def _text_of(msg: Message, limit: int = 64 * 1024) -> str:
    """The text parts of a bounce, decoded loosely, for its status code and diagnostic."""
    out: list[str] = []
    for part in msg.walk():
        if part.get_content_maintype() != "text":
            continue
        data = part.get_payload(decode=True)
        if isinstance(data, bytes):
            out.append(data.decode("utf-8", "replace"))
        if sum(map(len, out)) > limit:
            break
    return "\n".join(out)[:limit]


def _diagnostic(text: str, recipient: str, status: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for needle in (status, recipient):
        for line in lines:
            if needle and needle.lower() in line.lower() and len(line) > len(needle) + 2:
                return _clip(line, MAX_DIAGNOSTIC)
    return None


def _from_heuristics(msg: Message) -> BounceReport | None:
    temporary, permanent = all_failures(msg)
    if not temporary and not permanent:
        return None
    chosen = sorted(permanent or temporary)[0].decode("ascii", "replace")
    text = _text_of(msg)
    status = _status(text, "5.0.0" if permanent else "4.0.0")
    if permanent and not status.startswith("5"):
        status = "5.0.0"
    if not permanent and not status.startswith("4"):
        status = "4.0.0"
    return BounceReport(
        _clip(chosen, MAX_RECIPIENT), status, _diagnostic(text, chosen, status), None
    )


def _is_report(msg: Message) -> bool:
    return (
        msg.get_content_type() == "multipart/report"
        and str(msg.get_param("report-type", "")).lower() == "delivery-status"
    )


def read_bounce(raw: bytes) -> BounceReport | None:
    """What a bounce reports, or None when ``raw`` is no bounce (or reports no failure).

    Only the first :data:`READ_BYTES` are read for a report (a bounce's report comes
    before the message it returns), and the first :data:`HEURISTIC_BYTES` by the
    detectors of the other forms, so a large mail costs no more than a large bounce.
    The detectors' cost is still seconds on hostile lines: masd runs this in a process
    of its own, within a time budget (:mod:`masd.edges.bounce_reader`).
    """
    msg = email.message_from_bytes(raw[:READ_BYTES])
    if _is_report(msg):
        found = _from_report(msg)
        if found is not None:
            return found
    if len(raw) > HEURISTIC_BYTES:
        msg = email.message_from_bytes(raw[:HEURISTIC_BYTES])
    try:
        return _from_heuristics(msg)
    except Exception:  # noqa: BLE001 - a detector tripping on odd mail: no bounce found
        return None
