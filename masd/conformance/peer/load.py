"""The peer kit's checks as data: ``conformance/peer/<role>/<name>.json``, read and checked.

A check is one JSON object::

    {"name": "statuses-follow-the-table", "role": "mode",
     "clause": "docs/protocol.md §14", "description": "...",
     "steps": [
       {"send": {"message": "handoff.request", "as": "req", "answer": "accepted"}},
       {"collect": {"for": "req", "until": "terminal", "update_needs": true}},
       {"expect": {"rule": "statuses-follow-the-table", "for": "req"}}]}

Steps run in order: ``send`` posts a message the kit builds (or, with
``like``, the very message an earlier step sent, same ``id``) and checks the
answer; ``collect`` waits for the peer's own posts; ``expect`` applies a
named rule (:data:`masd.conformance.peer.rules.RULES`) to what was seen.
:func:`load_check` raises :class:`CheckError` naming the key at fault.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from masd.conformance.peer.rules import RULES
from masd.core.errors import MasdError

__all__ = [
    "ANSWERS",
    "ROLES",
    "CheckError",
    "Collect",
    "Expect",
    "PeerCheck",
    "Send",
    "load_check",
    "load_checks",
]

ROLES: Final = ("mode", "master")
#: What the kit sends, by the role of the peer under test.
SENDS: Final = {
    "mode": ("handoff.request", "handoff.update", "handoff.cancel"),
    "master": ("case.intake", "case.message"),
}
#: What ``collect`` waits for, by role: the first post, a terminal status, a case.assign,
#: or a quiet spell (nothing more arriving for a while).
UNTIL: Final = {"mode": ("first", "terminal", "quiet"), "master": ("assign", "quiet")}
#: Expected answers: a 2xx; a 2xx or a 4xx with the refusal body; a 401 with it.
ANSWERS: Final = ("accepted", "accepted-or-refused", "unauthenticated")
SECRETS: Final = ("right", "wrong", "none")
_CLAUSE: Final = re.compile(r"docs/protocol\.md §\d+(\.\d+)?")
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


class CheckError(MasdError):
    """A check file that is not a valid check (the detail names the key)."""

    code = "bad-check"


@dataclass(frozen=True)
class Send:
    message: str  # a type, or "" with ``like``
    name: str | None  # "as": what later steps call it
    like: str | None  # resend that earlier message as it was
    of: str | None  # "for": the handoff or case of that earlier message
    secret: str
    answer: str
    details: str  # "all" (every --detail) or "subject" (the subject alone)


@dataclass(frozen=True)
class Collect:
    of: str
    until: str
    update_needs: bool


@dataclass(frozen=True)
class Expect:
    rule: str
    of: str


Step = Send | Collect | Expect


@dataclass(frozen=True)
class PeerCheck:
    name: str
    role: str
    clause: str
    description: str
    steps: tuple[Step, ...]


def load_checks(folder: Path, role: str) -> list[PeerCheck]:
    """Every check of ``role`` under ``folder`` (``folder/<role>/*.json``), by name."""
    files = sorted((folder / role).glob("*.json"))
    if not files:
        raise CheckError(f"{folder / role}: no checks")
    return [load_check(path) for path in files]


def load_check(path: Path) -> PeerCheck:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckError(f"{path}: {exc}") from None
    try:
        return parse_check(raw, stem=path.stem)
    except CheckError as exc:
        raise CheckError(f"{path}: {exc.detail}") from None


def parse_check(raw: Any, *, stem: str | None = None) -> PeerCheck:
    table = _table(raw, "", {"name", "role", "clause", "description", "steps"})
    name, role, clause = (_text(table, "", key) for key in ("name", "role", "clause"))
    if not _NAME.fullmatch(name) or (stem is not None and name != stem):
        raise CheckError(f"name: {name!r} is not the file's name in lower-case words")
    if role not in ROLES:
        raise CheckError(f"role: {role!r} is not one of {', '.join(ROLES)}")
    if not _CLAUSE.fullmatch(clause):
        raise CheckError(f"clause: {clause!r} is not a section of docs/protocol.md")
    steps_raw = table.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise CheckError("steps: not a list of steps")
    named: set[str] = set()
    steps = tuple(_step(item, f"steps[{i}]", role, named) for i, item in enumerate(steps_raw))
    return PeerCheck(name, role, clause, _text(table, "", "description"), steps)


def _step(raw: Any, path: str, role: str, named: set[str]) -> Step:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise CheckError(f"{path}: not an object with one key (send, collect or expect)")
    ((kind, args),) = raw.items()
    where = f"{path}.{kind}"
    if kind == "send":
        return _send(args, where, role, named)
    if kind == "collect":
        t = _table(args, where, {"for", "until", "update_needs"})
        until = _choice(t, where, "until", UNTIL[role])
        update = t.get("update_needs", False)
        if not isinstance(update, bool):
            raise CheckError(f"{where}.update_needs: not true or false")
        return Collect(_ref(t, where, "for", named), until, update)
    if kind == "expect":
        t = _table(args, where, {"rule", "for"})
        rule = _choice(t, where, "rule", tuple(RULES[role]))
        return Expect(rule, _ref(t, where, "for", named))
    raise CheckError(f"{path}: {kind!r} is not send, collect or expect")


def _send(args: Any, where: str, role: str, named: set[str]) -> Send:
    t = _table(args, where, {"message", "as", "like", "for", "secret", "answer", "details"})
    like = _ref(t, where, "like", named) if "like" in t else None
    message = "" if like is not None else _choice(t, where, "message", SENDS[role])
    of = _ref(t, where, "for", named) if "for" in t else None
    first = SENDS[role][0]
    if message and message != first and of is None:
        raise CheckError(f"{where}.for: a {message} needs the {first} it belongs to")
    name = t.get("as")
    if name is not None:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in named:
            raise CheckError(f"{where}.as: {name!r} is not a new name")
        named.add(name)
    return Send(
        message=message,
        name=name,
        like=like,
        of=of,
        secret=_choice(t, where, "secret", SECRETS, default="right"),
        answer=_choice(t, where, "answer", ANSWERS),
        details=_choice(t, where, "details", ("all", "subject"), default="all"),
    )


def _table(raw: Any, path: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise CheckError(f"{path or 'the check'}: not an object")
    for key in raw:
        if key not in keys:
            raise CheckError(f"{path + '.' if path else ''}{key}: unknown key")
    return raw


def _text(t: dict[str, Any], path: str, key: str) -> str:
    value = t.get(key)
    if not isinstance(value, str) or not value:
        raise CheckError(f"{path + '.' if path else ''}{key}: missing or not a string")
    return value


def _choice(
    t: dict[str, Any], path: str, key: str, allowed: tuple[str, ...], default: str | None = None
) -> str:
    value = t.get(key, default)
    if value not in allowed:
        raise CheckError(f"{path}.{key}: {value!r} is not one of {', '.join(allowed)}")
    assert isinstance(value, str)
    return value


def _ref(t: dict[str, Any], path: str, key: str, named: set[str]) -> str:
    value = t.get(key)
    if value not in named:
        raise CheckError(f"{path}.{key}: {value!r} is not the name of an earlier send")
    assert isinstance(value, str)
    return value
