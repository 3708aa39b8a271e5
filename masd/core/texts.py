"""The words of the mails masd writes itself (docs/protocol.md §5, §6).

Plain, short, one per situation; each says what happened and what the
participant can do.  They go out with ``Auto-Submitted: auto-replied``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from masd.core.details import question_lines

_REASONS = {
    "mode-unavailable": "that channel is not available for this case",
    "mode-not-enabled": "that channel is not offered for this kind of request",
    "declined": "the request was declined",
    "out-of-hours": "the request came outside of service hours",
    "blocked": "the request could not be verified as coming from you",
}

_OUTCOMES = {
    "completed": "The {mode} you asked for has been completed.",
    "failed": "The {mode} you asked for could not be carried out.",
    "expired": "The {mode} you asked for has expired.",
    "refused": "The {mode} you asked for was refused: {why}.",
    "cancelled": "The {mode} you asked for has been cancelled.",
    "timed-out": "The {mode} you asked for did not happen in time and has been cancelled.",
}

_FOOTER = "We continue by email: reply to this message to add to your case.\n"


def acknowledge(case_address: str, notice: str | None = None) -> str:
    text = f"Your message has been received and recorded as case {case_address}.\n\n"
    if notice:
        text += notice
    else:
        text += "Reply to this message to add to your case.\n"
    return text


def resume(case_address: str, mode: str, status: str, fields: Mapping[str, Any]) -> str:
    reason = str(fields.get("reason") or "")
    line = _OUTCOMES[status].format(
        mode=mode, why=_REASONS.get(reason, reason or "no reason given")
    )
    text = f"{line}\n"
    if fields.get("detail") and status != "refused":
        text += f"Detail: {fields['detail']}\n"
    return f"{text}\nCase: {case_address}\n{_FOOTER}"


def question(case_address: str, mode: str, needs: Iterable[str], detail: str | None) -> str:
    text = f"To arrange the {mode} you asked for, we need a few more details.\n"
    if detail:
        text += f"{detail}\n"
    text += "Please reply with each line below filled in:\n\n"
    text += question_lines(needs)
    return f"{text}\nCase: {case_address}\n"
