"""The named rules a check's ``expect`` step applies to what the peer did.

Each rule reads :class:`Evidence` (the message the step names, the posts the
peer sent the kit during the check, what the kit recorded) and gives a
:class:`Verdict`: a problem (None when the rule holds) and what was seen,
for the output line.  The rules are those of docs/protocol.md for the email
side's peers: the status table (§14) and ``seq`` (§7.3), a repeated id (§7.2),
the envelope and the case reference (§7.1, §8.1), who may send what (§9.2),
ids (§2).  A problem names the field at fault (``case.key``, a status's
``seq`` and ``id``, the request's ``id``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from masd.conformance.peer.listener import Post
from masd.core import wire
from masd.core.address import check_id_grammar
from masd.core.errors import MasdError, TransitionError
from masd.core.status import MACHINE

__all__ = ["RULES", "Evidence", "Verdict"]


@dataclass(frozen=True)
class Evidence:
    message: Mapping[str, Any]  # the message the expect step names ("for")
    posts: tuple[Post, ...]  # what the peer posted to the kit during the check
    recorded: frozenset[str] = frozenset()  # message_refs the kit sent (master role)
    assigned: Mapping[str, Any] = field(default_factory=dict)  # intake_ref -> case


@dataclass(frozen=True)
class Verdict:
    problem: str | None
    seen: str


Rule = Callable[[Evidence], Verdict]


def _posts_about(ev: Evidence, kind: str, key: str) -> list[Post]:
    """The peer's posts of type ``kind`` whose ``key`` field is the stand-in message's."""
    wanted = ev.message.get(key)
    return [
        p
        for p in ev.posts
        if isinstance(p.json, dict) and p.json.get("type") == kind and p.json.get(key) == wanted
    ]


def _statuses(ev: Evidence) -> list[Post]:
    return _posts_about(ev, "handoff.status", "handoff_id")


def _show_statuses(posts: list[Post]) -> str:
    shown = [f"seq {p.json.get('seq')} {p.json.get('status')}" for p in posts]
    return ", ".join(shown) or "no handoff.status"


def seq_increases(ev: Evidence) -> Verdict:
    """Each status has an integer ``seq`` greater than the one before it."""
    posts = _statuses(ev)
    seen = _show_statuses(posts)
    if not posts:
        return Verdict("no handoff.status arrived for the handoff", seen)
    last: int | None = None
    before = posts[0]
    for p in posts:
        seq = p.json.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            return Verdict(f"seq {json.dumps(seq)} is not an integer", seen)
        if last is not None and seq == last:
            twice = f"seq {seq} came twice, in status ids {shown(before)} and {shown(p)}"
            return Verdict(f"{twice}: seq must increase", seen)
        if last is not None and seq < last:
            return Verdict(f"seq {seq} came after seq {last}: seq must increase", seen)
        last, before = seq, p
    return Verdict(None, seen)


def repeat_is_done(ev: Evidence) -> Verdict:
    """The request sent twice with one ``id`` ran once: no ``seq`` of its handoff's
    statuses comes twice (a second run starts again from the first), and seq increases."""
    posts = _statuses(ev)
    seen = _show_statuses(posts)
    if not posts:
        return Verdict("no handoff.status arrived for the handoff", seen)
    first: dict[str, Post] = {}
    for p in posts:
        seq = json.dumps(p.json.get("seq"))
        earlier = first.setdefault(seq, p)
        if earlier is not p:
            again = (
                f"the handoff.request sent again with id {shown_id(ev.message)} was run again: "
                f"seq {seq} {p.json.get('status')} came a second time (status ids "
                f"{shown(earlier)}, then {shown(p)}); a repeated id is already done (§7.2)"
            )
            return Verdict(again, seen)
    return seq_increases(ev)


def shown(post: Post) -> str:
    """A status's ``id``, as the output names it."""
    return shown_id(post.json)


def shown_id(message: Mapping[str, Any]) -> str:
    return json.dumps(message.get("id"))[:80]


def statuses_follow_the_table(ev: Evidence) -> Verdict:
    """From ``requested``, each status one the table allows a mode to send after the last."""
    posts = _statuses(ev)
    seen = _show_statuses(posts)
    if not posts:
        return Verdict("no handoff.status arrived for the handoff", seen)
    current = "requested"
    for p in posts:
        status = str(p.json.get("status"))
        try:
            MACHINE.check(current, status, source="mode")
        except TransitionError as exc:
            return Verdict(f"seq {p.json.get('seq')}: {exc.detail}", seen)
        current = status
    return Verdict(None, seen)


def statuses_well_formed(ev: Evidence) -> Verdict:
    """Each status: the peer's secret, the envelope, the schema, the request's case and id."""
    posts = _statuses(ev)
    seen = f"{len(posts)} handoff.status: " + _show_statuses(posts)
    if not posts:
        return Verdict("no handoff.status arrived for the handoff", seen)
    ids: set[str] = set()
    for p in posts:
        problem = _envelope_problem(p, "mode")
        if problem is None and p.json.get("case") != ev.message.get("case"):
            problem = (
                f"case: {json.dumps(p.json.get('case'))} is not the request's "
                f"{json.dumps(ev.message.get('case'))}"
            )
        if problem is None and p.json.get("id") in ids:
            problem = f"id: {p.json.get('id')} was used by an earlier status"
        if problem is not None:
            return Verdict(f"seq {p.json.get('seq')}: {problem}", seen)
        ids.add(str(p.json.get("id")))
    return Verdict(None, seen)


def no_status(ev: Evidence) -> Verdict:
    posts = _statuses(ev)
    seen = _show_statuses(posts)
    if posts:
        return Verdict("the peer posted statuses for a request it should have refused", seen)
    return Verdict(None, "no handoff.status for it")


def _assigns(ev: Evidence) -> list[Post]:
    return _posts_about(ev, "case.assign", "intake_ref")


def _show_assigns(posts: list[Post]) -> str:
    shown = [f"case.assign resource_id {json.dumps(p.json.get('resource_id'))}" for p in posts]
    return ", ".join(shown) or "no case.assign"


def assign_fits(ev: Evidence) -> Verdict:
    """A case.assign for the intake, with the peer's secret and a resource_id of the grammar."""
    posts = _assigns(ev)
    seen = _show_assigns(posts)
    if not posts:
        return Verdict("no case.assign arrived for the intake", seen)
    for p in posts:
        problem = _envelope_problem(p, "master")
        resource_id = p.json.get("resource_id")
        if problem is None and not isinstance(resource_id, str):
            problem = "resource_id: not a string"
        if problem is None:
            try:
                check_id_grammar(str(resource_id))
            except MasdError as exc:
                problem = f"resource_id {json.dumps(resource_id)}: {exc.detail}"
        if problem is not None:
            return Verdict(problem, seen)
    return Verdict(None, seen)


def assigned_once(ev: Evidence) -> Verdict:
    posts = _assigns(ev)
    seen = _show_assigns(posts)
    if len(posts) != 1:
        return Verdict(f"{len(posts)} case.assign for one intake, not 1", seen)
    return Verdict(None, seen)


def no_assign(ev: Evidence) -> Verdict:
    posts = _assigns(ev)
    if posts:
        return Verdict("the peer assigned an intake it should have refused", _show_assigns(posts))
    return Verdict(None, "no case.assign for it")


def mail_send_in_reply_to_recorded(ev: Evidence) -> Verdict:
    """Every mail.send names an assigned case and answers a message the kit sent."""
    cases = {json.dumps(c, sort_keys=True) for c in ev.assigned.values()}
    sends = [p for p in ev.posts if isinstance(p.json, dict) and p.json.get("type") == "mail.send"]
    seen = ", ".join(f"mail.send in_reply_to {p.json.get('in_reply_to')}" for p in sends)
    for p in sends:
        if json.dumps(p.json.get("case"), sort_keys=True) not in cases:
            return Verdict(f"mail.send on {json.dumps(p.json.get('case'))}: not a case", seen)
        if p.json.get("in_reply_to") not in ev.recorded:
            return Verdict(
                f"mail.send in_reply_to {json.dumps(p.json.get('in_reply_to'))} is not the "
                "message_ref of a message the kit sent",
                seen,
            )
    return Verdict(None, seen or "no mail.send")


def master_messages_well_formed(ev: Evidence) -> Verdict:
    """Every post: the peer's secret, the envelope, a type a master sends, the schema."""
    seen = ", ".join(p.type for p in ev.posts) or "nothing"
    if not ev.posts:
        return Verdict("the peer posted nothing", seen)
    for p in ev.posts:
        problem = _envelope_problem(p, "master")
        if problem is not None:
            return Verdict(f"{p.type}: {problem}", seen)
    return Verdict(None, seen)


def _envelope_problem(post: Post, kind: str) -> str | None:
    if not post.authenticated:
        return "posted without the peer's Bearer secret"
    try:
        envelope = wire.parse_envelope(post.body)
        wire.check_may_send(kind, envelope)
        wire.decode(envelope)
    except MasdError as exc:
        return f"{exc.code}: {exc.detail}"
    return None


#: The rules by the role of the peer under test.
RULES: Final[Mapping[str, Mapping[str, Rule]]] = {
    "mode": {
        "seq-increases": seq_increases,
        "repeat-is-done": repeat_is_done,
        "statuses-follow-the-table": statuses_follow_the_table,
        "statuses-well-formed": statuses_well_formed,
        "no-status": no_status,
    },
    "master": {
        "assign-fits": assign_fits,
        "assigned-once": assigned_once,
        "no-assign": no_assign,
        "mail-send-in-reply-to-recorded": mail_send_in_reply_to_recorded,
        "master-messages-well-formed": master_messages_well_formed,
    },
}
