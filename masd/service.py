"""Where inputs meet the store: load state, call the engine, apply its effects.

Every public function here runs inside one store job (the writer thread, one
transaction per input; see :mod:`masd.store`).  It reads the case's state,
asks the pure engine (:mod:`masd.core.engine`) what follows, and applies the
effects, so an input and everything it causes commit together.

Principle 10 (CONTRACT §6) is enforced in :func:`_send_mail`, the one place
every outbound mail passes through.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from sqlite_utils import Database

from masd.config import Config, TypeConfig, webhook_for
from masd.core import compose, texts
from masd.core.address import Address, check_id, parse_address
from masd.core.engine import (
    OK,
    AbandonRequest,
    CaseView,
    Context,
    CreateCase,
    Effect,
    EndpointView,
    HandoffView,
    OpenHandoff,
    Peer,
    PolicyView,
    Reply,
    SendContract,
    SendMail,
    Status,
    Thread,
    Transfer,
    TypeView,
    cancel_from_master,
    master_deadline,
    master_mail,
    request_failed,
    slave_mail,
    slave_request,
    slave_request_failed,
    status_from_mode,
)
from masd.core.errors import MasdError, TransitionError, WireError
from masd.core.event import GatewayEvent, ParsedMail, build_event
from masd.core.principle10 import CAP_WINDOW_SECONDS, Caps, Counts, Recipient, decide_send
from masd.core.status import MACHINE
from masd.core.trust import TrustSettings
from masd.core.wire import (
    CaseAssign,
    CasePolicy,
    Envelope,
    HandoffCancel,
    HandoffStatus,
    MailSend,
    PolicyPatch,
    decode,
    envelope,
)
from masd.peers import Directory, Principal, master_peer_id, mode_peer_id, peers_of, webhook_peer_id
from masd.store.schema import append_thread, dumps, next_number

log = logging.getLogger("masd")

#: PROFILE §2: the same message delivered again within 7 days is recorded once.
DEDUPE_WINDOW = 7 * 24 * 3600
#: PROFILE §6: "ids are kept at least 7 days".
IDEMPOTENCY_WINDOW = 7 * 24 * 3600
#: Cached TypeViews per Runtime, at most (see :meth:`Runtime.type_view`).
MAX_TYPE_VIEWS = 1024


class UnknownCase(MasdError):
    """``type=id@D`` with no such case (LMTP ``550 5.1.1``)."""

    code = "unknown-case"


@dataclass
class Runtime:
    """What the service needs besides the database: config, peers, ids, where statuses go."""

    config: Config
    new_id: Callable[[], str]
    directory: Directory = field(init=False)
    status_url: str = field(init=False)
    #: TypeViews already built, per (domain, type) as asked; the config never
    #: changes under a Runtime.
    _views: dict[tuple[str, str], TypeView] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.directory = Directory(peers_of(self.config))
        self.status_url = self.config.server.public_url.rstrip("/") + "/mas/v0.1/messages"
        self._views = {}

    def context(self, now: float) -> Context:
        return Context(now=now, new_id=self.new_id, status_url=self.status_url)

    def type_config(self, domain: str, type_: str) -> TypeConfig:
        typ = self.config.type_for(domain, type_)
        if typ is None:
            raise UnknownCase(f"no type {type_!r} at {domain}")
        return typ

    def type_view(self, domain: str, type_: str) -> TypeView:
        view = self._views.get((domain, type_))
        if view is not None:
            return view
        typ = self.type_config(domain, type_)
        endpoints = {
            mode: EndpointView(mode_peer_id(domain, type_, mode), ep.url, ep.deadline, ep.fields)
            for mode, ep in typ.endpoints.items()
        }
        view = TypeView(
            role="master" if typ.role == "master" else "slave",
            modes=frozenset(typ.modes),
            endpoints=MappingProxyType(endpoints),
            acknowledge=typ.acknowledge,
            require_dmarc_for_handoff=typ.require_dmarc_for_handoff,
            id_prefix=typ.id_prefix,
        )
        # Only configured types get here; the bound keeps odd spellings of
        # their names (the domain and type as asked) from piling up.
        if len(self._views) < MAX_TYPE_VIEWS:
            self._views[(domain, type_)] = view
        return view

    def trust(self) -> TrustSettings:
        server = self.config.server
        return TrustSettings(
            frozenset(server.trusted_authserv_ids), frozenset(server.trusted_hosts)
        )

    def master_of(self, domain: str, type_: str) -> Peer:
        master = self.type_config(domain, type_).master
        if master is None:
            raise MasdError(f"type {type_} at {domain} has no master", code="not-slave")
        return Peer(master_peer_id(domain, type_), master.url)

    def default_policy(self, domain: str, type_: str) -> PolicyView:
        policy = self.type_config(domain, type_).policy
        return PolicyView(policy.autonomous_send, policy.transfers)

    def transfer(self, domain: str, type_: str, policy: PolicyView) -> Transfer | None:
        """The webhook a policy's transfers URL points at (PROFILE §10), or None."""
        if policy.transfers == "block":
            return None
        hook = webhook_for(self.type_config(domain, type_), policy.transfers)
        if hook is None:
            return None
        return Transfer(webhook_peer_id(domain, type_, hook.url), policy.transfers, hook.fields)

    def url_of(self, peer_id: str | None) -> str | None:
        peer = self.directory.by_id.get(peer_id or "")
        return peer.url if peer else None


# --------------------------------------------------------------------------- loading state


def _row(db: Database, sql: str, params: Sequence[Any]) -> dict[str, Any] | None:
    cur = db.execute(sql, tuple(params))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([c[0] for c in cur.description], row, strict=True))


# Both queries read a handoff row as :func:`_handoff` wants it, with the data
# of its last status when it is negotiating (its ``needs``), in one statement.
_LOAD_CASE = (
    "SELECT c.key, c.address, c.domain, c.type, c.id, c.role, c.participant, "
    "h.handoff_id, h.case_key, h.mode, h.peer, h.status, h.last_seq, h.forwarded, "
    "h.webhook_url, CASE WHEN h.status = 'negotiating' THEN (SELECT s.data FROM statuses s "
    "WHERE s.handoff_id = h.handoff_id ORDER BY s.n DESC LIMIT 1) END AS last_data "
    "FROM cases c LEFT JOIN handoffs h ON h.handoff_id = (SELECT handoff_id FROM handoffs "
    "WHERE case_key = c.key AND closed_at IS NULL ORDER BY requested_at DESC LIMIT 1) "
    "WHERE c.key = ?"
)
_LOAD_HANDOFF = (
    "SELECT h.handoff_id, h.case_key, h.mode, h.peer, h.status, h.last_seq, h.forwarded, "
    "h.webhook_url, CASE WHEN h.status = 'negotiating' THEN (SELECT s.data FROM statuses s "
    "WHERE s.handoff_id = h.handoff_id ORDER BY s.n DESC LIMIT 1) END AS last_data "
    "FROM handoffs h WHERE h.handoff_id = ?"
)


def _handoff(rt: Runtime, row: Mapping[str, Any]) -> HandoffView:
    needs: tuple[str, ...] = ()
    if row["last_data"]:
        needs = tuple(json.loads(row["last_data"]).get("needs") or ())
    return HandoffView(
        handoff_id=row["handoff_id"],
        case_key=row["case_key"],
        mode=row["mode"],
        peer=row["peer"] or "email",
        url=row["webhook_url"] or rt.url_of(row["peer"]),
        status=row["status"],
        last_seq=row["last_seq"],
        needs=needs,
        forwarded=bool(row["forwarded"]),
    )


def load_case(rt: Runtime, db: Database, key: str) -> CaseView | None:
    """The case and its open handoff (the latest requested), in one statement."""
    row = _row(db, _LOAD_CASE, (key,))
    if row is None:
        return None
    return CaseView(
        key=row["key"],
        address=row["address"],
        domain=row["domain"],
        type=row["type"],
        id=row["id"],
        role=row["role"],
        participant=row["participant"] or "",
        open_handoff=_handoff(rt, row) if row["handoff_id"] is not None else None,
    )


def load_handoff(rt: Runtime, db: Database, handoff_id: str) -> HandoffView | None:
    row = _row(db, _LOAD_HANDOFF, (handoff_id,))
    return _handoff(rt, row) if row else None


def case_exists(db: Database, key: str) -> bool:
    return _row(db, "SELECT 1 AS x FROM cases WHERE key = ?", (key,)) is not None


# --------------------------------------------------------------------------- what a job woke


@dataclass(frozen=True)
class Wakes:
    """What a committed store job gave the outbox sender and the deadline timer to do.

    ``outbox``: the job queued at least one outbox row.  ``deadline``: the
    earliest ``handoffs.deadline_at`` it wrote, if any.  The app wakes the
    outbox only for the first and the timer only for a deadline sooner than
    the one it sleeps until, so a plain intake mail or a ``negotiating``
    status costs neither a read.

    How it stays exact under group commit: the writes themselves note what
    they wrote (:func:`_queue_outbox` each row, :func:`apply` each deadline)
    on the writer thread, and the job's top-level function (:func:`deliver`,
    :func:`receive`, :func:`fire_deadline`, :func:`outbox_failed`) takes the
    notes before it returns, so they travel in the job's own result and reach
    the edge only once that job has committed.  Nothing is read after a
    commit from state another job may have changed meanwhile.  Notes left by
    a job that failed (rolled back) are taken by the next job on the thread:
    a spurious wake, which costs a read; a wake is never lost.
    """

    outbox: bool = False
    deadline: float | None = None

    def __or__(self, other: Wakes) -> Wakes:
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        return Wakes(self.outbox or other.outbox, min(deadlines) if deadlines else None)

    @staticmethod
    def union(wakes: Iterable[Wakes]) -> Wakes:
        out = NO_WAKES
        for w in wakes:
            out = out | w
        return out


NO_WAKES: Final = Wakes()
#: A commit whose effect nobody described (and the test clock): wake both.
ALL_WAKES: Final = Wakes(outbox=True, deadline=float("-inf"))


class _JobNotes(threading.local):
    """What the store job running on this thread has written so far (see :class:`Wakes`)."""

    def __init__(self) -> None:
        self.queued = False
        self.deadline: float | None = None
        self.statuses: list[Status] = []


_notes = _JobNotes()


def _note_queued() -> None:
    _notes.queued = True


def _note_deadline(at: float) -> None:
    if _notes.deadline is None or at < _notes.deadline:
        _notes.deadline = at


def _take_notes() -> tuple[Wakes, tuple[Status, ...]]:
    """The notes of the running job (and of any failed one before it), emptied."""
    notes = _notes
    queued, deadline = notes.queued, notes.deadline
    wakes = Wakes(queued, deadline) if queued or deadline is not None else NO_WAKES
    statuses = tuple(notes.statuses)
    notes.queued, notes.deadline, notes.statuses = False, None, []
    return wakes, statuses


def _take_wakes() -> Wakes:
    """What the running job queued and which deadlines it wrote (see :class:`Wakes`)."""
    return _take_notes()[0]


class CommitListener(abc.ABC):
    """Told, on the event loop, what each committed store job gave to do.

    Each edge takes an ``on_commit`` callable and calls :func:`committed`
    after each of its store jobs commits: a CommitListener (the app's, which
    wakes the outbox and the timer) is told the job's :class:`Wakes`; any
    other callable is simply called.  Called with no argument, a listener
    wakes both (the test clock moved, or nothing says what changed).
    """

    @abc.abstractmethod
    def committed(self, wakes: Wakes) -> None:
        """A store job committed, having written ``wakes``."""

    def __call__(self) -> None:
        self.committed(ALL_WAKES)


def committed(on_commit: Callable[[], None], wakes: Wakes) -> None:
    """Tell ``on_commit`` that a store job committed, having written ``wakes``."""
    if isinstance(on_commit, CommitListener):
        on_commit.committed(wakes)
    else:
        on_commit()


# --------------------------------------------------------------------------- inbound mail


@dataclass(frozen=True)
class Delivered:
    message_ref: str
    case_key: str
    duplicate: bool = False
    #: What the job queued and which deadline it wrote (see :class:`Wakes`);
    #: a Delivered that does not say wakes both.
    wakes: Wakes = ALL_WAKES


def dedupe_key(message_id: str | None, rcpt_to: str, sha256: str) -> str:
    """PROFILE §2: same Message-ID (or none), same recipient, same SHA-256 of the bytes."""
    text = f"{message_id or ''}\0{rcpt_to.lower()}\0{sha256}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def deliver(
    rt: Runtime, db: Database, rcpt: Address, mail: ParsedMail, raw: bytes, sha256: str, now: float
) -> Delivered:
    """Record one recipient's copy of a mail and everything it causes."""
    ev = mail.event
    dedupe = dedupe_key(ev.message_id, ev.rcpt_to, sha256)
    seen = _row(db, "SELECT message_ref, at FROM deliveries WHERE dedupe = ?", (dedupe,))
    if seen and seen["at"] > now - DEDUPE_WINDOW:
        m = _row(db, "SELECT case_key FROM messages WHERE message_ref = ?", (seen["message_ref"],))
        return Delivered(
            seen["message_ref"],
            (m or {}).get("case_key") or "",
            duplicate=True,
            wakes=_take_wakes(),
        )
    typ = rt.type_view(rcpt.domain, rcpt.type)
    if typ.role == "slave":
        return _deliver_slave(rt, db, rcpt, mail, raw, sha256, now, dedupe)
    case: CaseView | None = None
    new_case_id = ""
    if rcpt.kind == "resource":
        case = load_case(rt, db, rcpt.key)
        if case is None:
            raise UnknownCase(f"no case {rcpt.key}")
    else:
        new_case_id = f"{typ.id_prefix}{next_number(db, rcpt.domain, rcpt.type)}"
    effects = master_mail(case, rcpt, mail, typ, rt.context(now), new_case_id=new_case_id)
    opened = case is None
    if case is None:
        created = next(e for e in effects if isinstance(e, CreateCase))
        case = created.case
        _create_case(db, case, now)
    _record_message(db, mail, raw, sha256, now, dedupe, case_key=case.key)
    recorded = _Recorded(ev, case.key, opened=opened)
    apply(
        rt, db, case, [e for e in effects if not isinstance(e, CreateCase)], now, recorded=recorded
    )
    return Delivered(ev.message_ref, case.key, wakes=_take_wakes())


@dataclass(frozen=True)
class _Recorded:
    """The mail the running job has just recorded on ``case_key``.

    A send that answers it reads its sender and threading headers from here
    rather than reading back (and decoding) the row the job has just written.
    """

    event: GatewayEvent
    case_key: str
    #: the job created the case for this mail, so it is the case's only mail
    opened: bool


def _record_message(
    db: Database,
    mail: ParsedMail,
    raw: bytes,
    sha256: str,
    now: float,
    dedupe: str,
    *,
    case_key: str | None,
    intake_ref: str | None = None,
) -> None:
    ev = mail.event
    db.execute(
        "INSERT INTO messages (message_ref, case_key, intake_ref, rcpt_to, mail_from, message_id, "
        "from_address, sha256, size, raw, event, received_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            ev.message_ref,
            case_key,
            intake_ref,
            ev.rcpt_to,
            ev.mail_from,
            ev.message_id,
            ev.from_address,
            sha256,
            len(raw),
            raw,
            dumps(ev.to_json()),
            now,
        ),
    )
    db.execute(
        "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?, ?, ?) "
        "ON CONFLICT (dedupe) DO UPDATE SET message_ref = excluded.message_ref, at = excluded.at",
        (dedupe, ev.message_ref, now),
    )


def _deliver_slave(
    rt: Runtime,
    db: Database,
    rcpt: Address,
    mail: ParsedMail,
    raw: bytes,
    sha256: str,
    now: float,
    dedupe: str,
) -> Delivered:
    """CONTRACT §3.2.1-§3.2.2: intake mail becomes case.intake; case mail case.message."""
    ev = mail.event
    master = rt.master_of(rcpt.domain, rcpt.type)
    if rcpt.kind == "intake":
        # "Email MUST NOT invent case identifiers in this role. Until
        # assigned, the intake stays pending."
        intake_ref = f"intake-{rt.new_id()}"
        _record_message(db, mail, raw, sha256, now, dedupe, case_key=None, intake_ref=intake_ref)
        db.execute(
            "INSERT INTO intakes (intake_ref, domain, type, message_ref, requested_mode, "
            "created_at) VALUES (?,?,?,?,?,?)",
            (intake_ref, rcpt.domain, rcpt.type, ev.message_ref, rcpt.mode, now),
        )
        message = envelope(
            "case.intake",
            f"intake-{ev.message_ref}",
            None,
            intake_ref=intake_ref,
            resource_type=rcpt.type,
            event=ev.to_json(),
        )
        # PROFILE §9: "case.intake carries requested_mode always, null when none".
        message["requested_mode"] = rcpt.mode
        _queue_outbox(
            rt,
            db,
            "contract",
            f"intake:{intake_ref}|{master.peer}",
            master.peer,
            None,
            master.url,
            message,
            now,
        )
        log.info("intake pending intake_ref=%s message_ref=%s", intake_ref, ev.message_ref)
        return Delivered(ev.message_ref, "", wakes=_take_wakes())
    case = load_case(rt, db, rcpt.key)
    if case is None:
        raise UnknownCase(f"no case {rcpt.key}")
    _record_message(db, mail, raw, sha256, now, dedupe, case_key=case.key)
    policy = _policy(rt, db, case)
    effects = slave_mail(
        case,
        rcpt,
        mail,
        policy,
        rt.context(now),
        master=master,
        transfer=rt.transfer(case.domain, case.type, policy),
        require_dmarc=rt.type_config(case.domain, case.type).require_dmarc_for_handoff,
    )
    apply(rt, db, case, effects, now, recorded=_Recorded(ev, case.key, opened=False))
    return Delivered(ev.message_ref, case.key, wakes=_take_wakes())


def _policy(rt: Runtime, db: Database, case: CaseView) -> PolicyView:
    """The case's policy: the type's defaults, overridden by what the master set."""
    base = rt.default_policy(case.domain, case.type)
    row = _row(db, "SELECT policy FROM cases WHERE key = ?", (case.key,))
    stored = json.loads(row["policy"]) if row and row["policy"] else {}
    return PolicyView(
        bool(stored.get("autonomous_send", base.autonomous_send)),
        str(stored.get("transfers", base.transfers)),
    )


def _patched(policy: PolicyView, patch: PolicyPatch | None) -> PolicyView:
    """PROFILE §9: "case.policy changes only the fields it carries"."""
    if patch is None:
        return policy
    return PolicyView(
        policy.autonomous_send if patch.autonomous_send is None else patch.autonomous_send,
        policy.transfers if patch.transfers is None else patch.transfers,
    )


def _store_policy(db: Database, case_key: str, policy: PolicyView) -> None:
    stored = {"autonomous_send": policy.autonomous_send, "transfers": policy.transfers}
    db.execute("UPDATE cases SET policy = ? WHERE key = ?", (dumps(stored), case_key))


def _create_case(db: Database, case: CaseView, now: float) -> None:
    db.execute(
        "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at) "
        "VALUES (?,?,?,?,?,?,?,?)",
        (case.key, case.address, case.domain, case.type, case.id, case.role, case.participant, now),
    )


# --------------------------------------------------------------------------- contract messages in


@dataclass(frozen=True)
class Received:
    """The answer to a contract message, and what its store job wrote."""

    status: int
    body: Mapping[str, Any]
    wakes: Wakes = NO_WAKES
    #: The handoff statuses the message recorded, in order: the edge's one
    #: log line for the message names them (:func:`_record_status` does not).
    statuses: tuple[Status, ...] = ()


def receive(rt: Runtime, db: Database, who: Principal, env: Envelope, now: float) -> Received:
    """A contract message that passed authentication and the envelope checks.

    PROFILE §6 order from here: idempotency, schema, unknown case/handoff,
    forbidden, stale seq, invalid transition.  Every answer but a 5xx is
    kept for the (peer, id), so a repeat gets the original status and body.
    """
    answered = _answered(db, who, env)
    if answered is not None:
        return Received(*answered, _take_wakes())
    # A refusal leaves nothing behind but its idempotency row: whatever the
    # handler recorded before refusing is rolled back to this savepoint.
    db.execute("SAVEPOINT receive")
    try:
        reply = _dispatch(rt, db, who, env, now)
        status, body = reply.status, dict(reply.body)
        refused = False
    except (WireError, TransitionError) as exc:
        db.execute("ROLLBACK TO receive")
        status = exc.status if isinstance(exc, WireError) else 409
        body = {"ok": False, "error": exc.code, "detail": exc.detail}
        refused = True
    except BaseException:
        db.execute("ROLLBACK TO receive")
        db.execute("RELEASE receive")
        raise
    db.execute("RELEASE receive")
    db.execute(
        "INSERT INTO idempotency (peer, id, status, body, at) VALUES (?, ?, ?, ?, ?)",
        (who.id, env.id, status, dumps(body), now),
    )
    wakes, statuses = _take_notes()
    return Received(status, body, wakes, () if refused else statuses)


def _answered(db: Database, who: Principal, env: Envelope) -> tuple[int, Any] | None:
    """The answer kept for this (peer, id), if the message was received before."""
    kept = _row(
        db, "SELECT status, body FROM idempotency WHERE peer = ? AND id = ?", (who.id, env.id)
    )
    if kept is not None:
        return int(kept["status"]), json.loads(kept["body"])
    return None


def _dispatch(rt: Runtime, db: Database, who: Principal, env: Envelope, now: float) -> Reply:
    msg = decode(env)
    if isinstance(msg, HandoffStatus):
        return _handoff_status(rt, db, who, msg, now)
    if isinstance(msg, CaseAssign):
        return _case_assign(rt, db, who, msg, now)
    # The rest name a case, owned by a master (PROFILE §6: "a master may send
    # only master messages, only for its own domain and types").
    _check_transfers(rt, msg)
    case = load_case(rt, db, msg.case.key)
    if case is None:
        raise WireError(f"case.key: no case {msg.case.key}", code="unknown-case", status=404)
    if case.role != "slave" or not who.serves(case.domain, case.type):
        raise WireError(
            f"case: {case.key} is not a case of this master", code="forbidden", status=403
        )
    append_thread(db, case.key, "contract.in", {"type": env.type, "id": env.id}, at=now)
    if isinstance(msg, CasePolicy):
        policy = _patched(_policy(rt, db, case), msg.policy)
        _store_policy(db, case.key, policy)
        return Reply(200, OK)
    if isinstance(msg, MailSend):
        return _mail_send(rt, db, case, msg, now)
    assert isinstance(msg, HandoffCancel)
    handoff = _named_handoff(rt, db, case, msg.handoff_id)
    if handoff is None or handoff.case_key != case.key:
        raise WireError(
            f"handoff_id: no handoff {msg.handoff_id} on case {case.key}",
            code="unknown-handoff",
            status=404,
        )
    reply = cancel_from_master(case, handoff, msg, rt.context(now))
    apply(rt, db, case, reply.effects, now, quiet=True)
    return reply


def _named_handoff(
    rt: Runtime, db: Database, case: CaseView, handoff_id: str
) -> HandoffView | None:
    """The handoff a message names: usually the case's open one, already loaded."""
    if case.open_handoff is not None and case.open_handoff.handoff_id == handoff_id:
        return case.open_handoff
    return load_handoff(rt, db, handoff_id)


def _check_transfers(rt: Runtime, msg: CasePolicy | MailSend | HandoffCancel) -> None:
    """PROFILE §10: a transfers URL outside the configured webhooks is ``400 invalid-message``."""
    if isinstance(msg, CasePolicy):
        type_, domain = msg.case.key.partition("=")[0], msg.case.key.rpartition("@")[2]
        _check_webhook(rt, domain, type_, msg.policy, "transfers.webhook")


def _check_webhook(
    rt: Runtime, domain: str, type_: str, patch: PolicyPatch | None, field: str
) -> None:
    if patch is None or patch.transfers in (None, "block"):
        return
    typ = rt.config.type_for(domain, type_)
    if typ is None or webhook_for(typ, patch.transfers or "") is None:
        raise WireError(
            f"{field}: {patch.transfers!r} is not under a configured webhooks url "
            f"of {type_}@{domain}",
            code="invalid-message",
        )


def _handoff_status(
    rt: Runtime, db: Database, who: Principal, msg: HandoffStatus, now: float
) -> Reply:
    # One statement reads the case and its open handoff, which is usually the
    # one the status is about; PROFILE §6 order: unknown case, then handoff.
    case = load_case(rt, db, msg.case.key)
    if case is None:
        raise WireError(f"case.key: no case {msg.case.key}", code="unknown-case", status=404)
    handoff = _named_handoff(rt, db, case, msg.handoff_id)
    if handoff is None or handoff.case_key != case.key:
        raise WireError(
            f"handoff_id: no handoff {msg.handoff_id} on case {msg.case.key}",
            code="unknown-handoff",
            status=404,
        )
    if not who.covers(handoff.peer):
        raise WireError(
            f"handoff_id: {msg.handoff_id} was not sent to this peer", code="forbidden", status=403
        )
    if case.role == "master":
        reply = status_from_mode(case, handoff, msg, resume=True)
    else:
        # CONTRACT §3.2.4: email "relays every handoff.status to the master,
        # and does the negotiation ... only when autonomous_send is true".
        policy = _policy(rt, db, case)
        reply = status_from_mode(
            case,
            handoff,
            msg,
            resume=False,
            ask=policy.autonomous_send,
            relay=rt.master_of(case.domain, case.type),
        )
    apply(rt, db, case, reply.effects, now, quiet=True)
    return reply


def _case_assign(rt: Runtime, db: Database, who: Principal, msg: CaseAssign, now: float) -> Reply:
    """CONTRACT §3.2.1: the master names the case; email adopts ``TYPE=ID@D``."""
    intake = _row(db, "SELECT * FROM intakes WHERE intake_ref = ?", (msg.intake_ref,))
    if intake is None:
        raise WireError(
            f"intake_ref: no intake {msg.intake_ref}", code="unknown-intake", status=404
        )
    domain, type_ = intake["domain"], intake["type"]
    # PROFILE §6: "400 invalid-message (schema, bounds ...)" before "403
    # forbidden (right peer type, not its case ...)"; the id's bound depends
    # on the intake's type, so both follow the lookup.
    try:
        resource_id = check_id(msg.resource_id, type=type_)
    except MasdError as exc:
        raise WireError(f"resource_id: {exc.detail}", code="invalid-message") from exc
    _check_webhook(rt, domain, type_, msg.policy, "policy.transfers.webhook")
    if not who.serves(domain, type_):
        raise WireError(
            f"intake_ref: {msg.intake_ref} is not an intake of this master",
            code="forbidden",
            status=403,
        )
    address = parse_address(f"{type_}={resource_id}@{domain}", delimiter="")
    # PROFILE §1: the canonical address has the "id as assigned"; an id with
    # the same key names the same case, which keeps its first spelling.
    adopted = _row(db, "SELECT address FROM cases WHERE key = ?", (address.key,))
    ref = {"address": adopted["address"] if adopted else address.canonical, "key": address.key}
    if intake["case_key"] is not None:
        if intake["case_key"] == address.key:
            return Reply(200, {"ok": True, "case": ref})  # the same assignment again
        raise WireError(
            f"intake_ref: {msg.intake_ref} is already assigned to {intake['case_key']}",
            code="already-assigned",
            status=409,
        )
    message = _row(db, "SELECT * FROM messages WHERE message_ref = ?", (intake["message_ref"],))
    assert message is not None
    case = load_case(rt, db, address.key)
    if case is None:
        case = CaseView(
            key=address.key,
            address=address.canonical,
            domain=domain,
            type=type_,
            id=resource_id,
            role="slave",
            participant=message["from_address"] or "",
        )
        _create_case(db, case, now)
        _store_policy(db, case.key, _patched(rt.default_policy(domain, type_), msg.policy))
    elif msg.policy is not None:
        _store_policy(db, case.key, _patched(_policy(rt, db, case), msg.policy))
    db.execute(
        "UPDATE intakes SET case_key = ?, assigned_at = ? WHERE intake_ref = ?",
        (case.key, now, msg.intake_ref),
    )
    # PROFILE §9: "On case.assign the intake's message becomes the case's
    # first message: mail.send may answer it."
    db.execute(
        "UPDATE messages SET case_key = ? WHERE message_ref = ?", (case.key, message["message_ref"])
    )
    event = json.loads(message["event"])
    append_thread(
        db,
        case.key,
        "mail.in",
        {
            "message_ref": message["message_ref"],
            "from": message["from_address"],
            "subject": event.get("subject"),
            "dmarc": event.get("auth", {}).get("dmarc"),
            "automated": bool(event.get("automated", {}).get("is")),
            "intake_ref": msg.intake_ref,
            **({"requested_mode": intake["requested_mode"]} if intake["requested_mode"] else {}),
        },
        at=now,
    )
    append_thread(db, case.key, "contract.in", {"type": "case.assign", "id": msg.id}, at=now)
    log.info("intake assigned intake_ref=%s key=%s", msg.intake_ref, case.key)
    policy = _policy(rt, db, case)
    effects: list[Effect] = []
    if policy.autonomous_send:
        effects.append(
            SendMail(
                "acknowledge", texts.acknowledge(case.address), reply_to=message["message_ref"]
            )
        )
    if intake["requested_mode"]:
        # "A mode requested in the intake mail (requested_mode) is handled
        # under that policy once the case exists."
        parsed = build_event(
            message["raw"],
            mail_from=message["mail_from"],
            rcpt_to=message["rcpt_to"],
            received_at=event.get("received_at", ""),
            message_ref=message["message_ref"],
            trust=rt.trust(),
        )
        effects += slave_request(
            load_case(rt, db, case.key) or case,
            intake["requested_mode"],
            parsed,
            policy,
            rt.context(now),
            master=rt.master_of(domain, type_),
            transfer=rt.transfer(domain, type_, policy),
            require_dmarc=rt.type_config(domain, type_).require_dmarc_for_handoff,
        )
    apply(rt, db, case, effects, now, quiet=True)
    return Reply(200, {"ok": True, "case": ref})


def _mail_send(rt: Runtime, db: Database, case: CaseView, msg: MailSend, now: float) -> Reply:
    """CONTRACT §3.2.3: a reply to a recorded message of the case, to its sender."""
    subject = msg.subject
    refusal = apply(
        rt,
        db,
        case,
        [
            SendMail(
                "reply", msg.body, subject=subject, reply_to=msg.in_reply_to, auto_submitted=False
            )
        ],
        now,
    )[0]
    if refusal is not None:
        return Reply(
            422,
            {
                "ok": False,
                "error": "refused",
                "reason": refusal,
                "detail": f"in_reply_to {msg.in_reply_to}: {refusal}",
            },
        )
    return Reply(200, {"ok": True, "sent": True})


# --------------------------------------------------------------------------- time and outbox


def due_deadlines(db: Database, now: float, limit: int = 100) -> list[str]:
    rows = db.execute(
        "SELECT handoff_id FROM handoffs WHERE closed_at IS NULL AND deadline_at <= ? "
        "ORDER BY deadline_at LIMIT ?",
        (now, limit),
    ).fetchall()
    return [r[0] for r in rows]


def next_deadline(db: Database) -> float | None:
    row = db.execute(
        "SELECT MIN(deadline_at) FROM handoffs WHERE closed_at IS NULL AND deadline_at IS NOT NULL"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def fire_deadline(rt: Runtime, db: Database, handoff_id: str, now: float) -> Wakes | None:
    """CONTRACT §3.1.2 / PROFILE §8 for one handoff: what it woke, or None if nothing was due."""
    handoff = load_handoff(rt, db, handoff_id)
    if handoff is None or handoff.closed:
        return None
    case = load_case(rt, db, handoff.case_key)
    assert case is not None
    apply(rt, db, case, master_deadline(case, handoff, rt.context(now)), now)
    return _take_wakes()


@dataclass(frozen=True)
class OutboxItem:
    id: int
    kind: str
    queue: str
    peer: str | None
    case_key: str | None
    url: str | None
    payload: str
    attempts: int
    deliver_until: float
    next_attempt_at: float = 0.0


# The outbox sender finds due queue heads without reading every due row, so a
# backlog for a peer that takes nothing now (hung, failing, full) is not read
# again on each look: new rows by id, rows whose backoff ran out by time, the
# next head of a queue whose send ended, more heads of one peer from an id on
# (masd/edges/outbox_heads.py says when each is asked).  A head is the lowest
# pending id of its queue (PROFILE §7: in order per case and peer).


def outbox_after(
    db: Database, after_id: int, now: float, limit: int
) -> tuple[list[OutboxItem], int, bool]:
    """Due heads among the ``limit`` rows after ``after_id``; the last id looked at; whether
    the page was full (more rows may follow)."""
    rows = db.execute(
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until, o.next_attempt_at, (o.state = 'pending' AND o.next_attempt_at <= :now "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending')) "
        "FROM outbox o WHERE o.id > :after ORDER BY o.id LIMIT :limit",
        {"now": now, "after": after_id, "limit": limit},
    ).fetchall()
    last = rows[-1][0] if rows else after_id
    return [OutboxItem(*r[:-1]) for r in rows if r[-1]], last, len(rows) >= limit


def outbox_fell_due(
    db: Database, since: tuple[float, int], now: float, limit: int
) -> list[OutboxItem]:
    """Heads due by ``now`` whose (next_attempt_at, id) comes after ``since``, in that order."""
    rows = db.execute(
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until, o.next_attempt_at FROM outbox o WHERE o.state = 'pending' "
        "AND o.next_attempt_at >= :at AND NOT (o.next_attempt_at = :at AND o.id <= :id) "
        "AND o.next_attempt_at <= :now "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at, o.id LIMIT :limit",
        {"at": since[0], "id": since[1], "now": now, "limit": limit},
    ).fetchall()
    return [OutboxItem(*r) for r in rows]


def outbox_heads(db: Database, queues: Iterable[str], now: float) -> list[OutboxItem]:
    """The due heads of ``queues``."""
    rows = db.execute(
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until, o.next_attempt_at FROM outbox o INDEXED BY outbox_queue "
        "WHERE o.state = 'pending' AND o.queue IN (SELECT value FROM json_each(:queues)) "
        "AND o.next_attempt_at <= :now "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending')",
        {"queues": json.dumps(sorted(set(queues))), "now": now},
    ).fetchall()
    return [OutboxItem(*r) for r in rows]


def outbox_peer_heads(
    db: Database, peers: Iterable[str], from_id: int, now: float, busy: Iterable[str], limit: int
) -> list[OutboxItem]:
    """Up to ``limit`` due heads of ``peers`` from ``from_id`` on, by id, none of ``busy``."""
    rows = db.execute(
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until, o.next_attempt_at FROM outbox o NOT INDEXED WHERE o.id >= :from_id "
        "AND IFNULL(o.peer, '') IN (SELECT value FROM json_each(:peers)) "
        "AND o.queue NOT IN (SELECT value FROM json_each(:busy)) "
        "AND o.state = 'pending' AND o.next_attempt_at <= :now "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.id LIMIT :limit",
        {
            "from_id": from_id,
            "peers": json.dumps(sorted(set(peers))),
            "busy": json.dumps(sorted(set(busy))),
            "now": now,
            "limit": limit,
        },
    ).fetchall()
    return [OutboxItem(*r) for r in rows]


def outbox_start_id(db: Database) -> int:
    """The id after which the sender starts looking: just before the first pending row."""
    row = db.execute(
        "SELECT (SELECT MIN(id) FROM outbox WHERE state = 'pending'), (SELECT MAX(id) FROM outbox)"
    ).fetchone()
    first, last = row if row is not None else (None, None)
    return int(first) - 1 if first is not None else int(last or 0)


def next_outbox_at(db: Database, now: float) -> float | None:
    """The earliest time after ``now`` at which a pending row falls due, if any."""
    row = db.execute(
        "SELECT MIN(next_attempt_at) FROM outbox WHERE state = 'pending' AND next_attempt_at > ?",
        (now,),
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def outbox_done(db: Database, item_id: int, now: float) -> None:
    db.execute(
        "UPDATE outbox SET state = 'done', attempts = attempts + 1, last_error = NULL WHERE id = ?",
        (item_id,),
    )


def backoff(attempts: int, rng: random.Random | None = None) -> float:
    """PROFILE §7: "exponential backoff from 1 s to 5 min with jitter"."""
    base = min(300.0, 2.0 ** max(0, attempts - 1))
    return base * (0.5 + (rng or random).random() / 2)


def outbox_retry(
    rt: Runtime, db: Database, item: OutboxItem, error: str, now: float
) -> tuple[bool, Wakes]:
    """A failure worth retrying; gives up (and fails the item) after ``retry_for``.

    Returns whether the item is kept for another attempt, and what failing it woke.
    """
    next_at = now + backoff(item.attempts + 1)
    if next_at > item.deliver_until:
        error = f"gave up after {item.attempts + 1} attempts: {error}"
        return False, outbox_failed(rt, db, item, error, now)
    db.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? "
        "WHERE id = ?",
        (error[:1000], next_at, item.id),
    )
    return True, _take_wakes()


def outbox_failed(rt: Runtime, db: Database, item: OutboxItem, detail: str, now: float) -> Wakes:
    """PROFILE §7: "4xx: not retried; recorded in the thread as a failed delivery
    (a refused handoff.request records failed with the detail and resumes by
    email)".  Returns what it woke (a resume mail, a status to the master)."""
    _outbox_failed(rt, db, item, detail, now)
    return _take_wakes()


def _outbox_failed(rt: Runtime, db: Database, item: OutboxItem, detail: str, now: float) -> None:
    db.execute(
        "UPDATE outbox SET state = 'failed', attempts = attempts + 1, last_error = ? WHERE id = ?",
        (detail[:1000], item.id),
    )
    if not item.case_key:
        return
    case = load_case(rt, db, item.case_key)
    if case is None:
        return
    data: dict[str, Any] = {"outbox_id": item.id, "kind": item.kind, "detail": detail[:1000]}
    effects: list[Effect] = []
    if item.kind == "contract":
        message = json.loads(item.payload)
        data.update(type=message.get("type"), id=message.get("id"), peer=item.peer)
        if message.get("type") == "handoff.request":
            handoff = load_handoff(rt, db, message.get("handoff_id", ""))
            if handoff is not None and case.role == "slave":
                # CONTRACT §3.2.3-§3.2.4: no resume mail; the master is told.
                master = rt.master_of(case.domain, case.type)
                effects = slave_request_failed(case, handoff, detail, master=master)
            elif handoff is not None:
                effects = request_failed(case, handoff, detail)
    else:
        data["to"] = json.loads(item.payload).get("rcpt_to")
    append_thread(db, case.key, "delivery.failed", data, at=now)
    apply(rt, db, case, effects, now)


# --------------------------------------------------------------------------- applying effects


def apply(
    rt: Runtime,
    db: Database,
    case: CaseView,
    effects: Iterable[Effect],
    now: float,
    *,
    quiet: bool = False,
    recorded: _Recorded | None = None,
) -> list[str | None]:
    """Carry out the engine's effects on ``case``; returns each SendMail's refusal (or None).

    ``quiet``: statuses are not logged here, the caller's line names them
    (a contract message: :class:`Received` ``.statuses``).  ``recorded``: the
    mail this job has just recorded, which a send may answer (:class:`_Recorded`).
    """
    refusals: list[str | None] = []
    for effect in effects:
        if isinstance(effect, CreateCase):
            _create_case(db, effect.case, now)
        elif isinstance(effect, Thread):
            append_thread(db, case.key, effect.kind, effect.data, at=now)
        elif isinstance(effect, OpenHandoff):
            db.execute(
                "INSERT INTO handoffs (handoff_id, case_key, mode, peer, status, requested_at, "
                "deadline_at, forwarded, webhook_url, details) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    effect.handoff_id,
                    case.key,
                    effect.mode,
                    effect.peer,
                    "requested",
                    now,
                    effect.deadline_at,
                    int(effect.forwarded),
                    effect.url if effect.peer.startswith("webhook:") else None,
                    dumps(dict(effect.details)),
                ),
            )
            if effect.deadline_at is not None:
                _note_deadline(effect.deadline_at)
        elif isinstance(effect, Status):
            _record_status(db, case, effect, now, quiet=quiet)
        elif isinstance(effect, SendContract):
            _queue_contract(rt, db, case, effect, now)
        elif isinstance(effect, SendMail):
            refusals.append(_send_mail(rt, db, case, effect, now, recorded=recorded))
        elif isinstance(effect, AbandonRequest):
            _abandon_request(db, case, effect.handoff_id, now)
    return refusals


def _record_status(
    db: Database, case: CaseView, s: Status, now: float, *, quiet: bool = False
) -> None:
    # The status's number n (1, 2, ... per handoff) is taken in the INSERT,
    # and the handoff's mode comes back from its UPDATE: two statements.
    db.execute(
        "INSERT INTO statuses (handoff_id, n, seq, status, source, data, at) "
        "SELECT ?, COALESCE(MAX(n), 0) + 1, ?, ?, ?, ?, ? FROM statuses WHERE handoff_id = ?",
        (s.handoff_id, s.seq, s.status, s.source, dumps(dict(s.fields)), now, s.handoff_id),
    )
    terminal = MACHINE.is_terminal(s.status)
    (mode,) = db.execute(
        "UPDATE handoffs SET status = ?, last_seq = COALESCE(?, last_seq), "
        "closed_at = CASE WHEN ? THEN ? ELSE closed_at END WHERE handoff_id = ? RETURNING mode",
        (s.status, s.seq, terminal, now, s.handoff_id),
    ).fetchall()[0]
    entry = {"handoff_id": s.handoff_id, "mode": mode, "status": s.status, "source": s.source}
    if s.seq is not None:
        entry["seq"] = s.seq
    entry.update(s.fields)
    append_thread(db, case.key, "status", entry, at=now)
    _notes.statuses.append(s)
    if quiet:
        return
    log.info(
        "status case=%s handoff=%s status=%s seq=%s source=%s",
        case.key,
        s.handoff_id,
        s.status,
        s.seq,
        s.source,
    )


def _queue_outbox(
    rt: Runtime,
    db: Database,
    kind: str,
    queue: str,
    peer: str,
    case_key: str | None,
    url: str | None,
    payload: Mapping[str, Any],
    now: float,
) -> None:
    """One outbox row; rows of one ``queue`` are delivered in order (PROFILE §7)."""
    db.execute(
        "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
        "next_attempt_at, deliver_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            kind,
            queue,
            peer,
            case_key,
            url,
            dumps(dict(payload)),
            now,
            now,
            now + rt.config.server.retry_for,
        ),
    )
    _note_queued()  # the job's Wakes: the outbox has work once it commits


def _queue_contract(rt: Runtime, db: Database, case: CaseView, s: SendContract, now: float) -> None:
    message = dict(s.message)
    _queue_outbox(rt, db, "contract", f"{case.key}|{s.peer}", s.peer, case.key, s.url, message, now)
    append_thread(
        db,
        case.key,
        "contract.out",
        {"type": message["type"], "id": message["id"], "peer": s.peer, "handoff_id": s.handoff_id},
        at=now,
    )


def _abandon_request(db: Database, case: CaseView, handoff_id: str, now: float) -> None:
    rows = db.execute(
        "UPDATE outbox SET state = 'abandoned' WHERE state = 'pending' AND kind = 'contract' "
        "AND case_key = ? AND json_extract(payload, '$.type') = 'handoff.request' "
        "AND json_extract(payload, '$.handoff_id') = ? RETURNING id, json_extract(payload, '$.id')",
        (case.key, handoff_id),
    ).fetchall()
    for outbox_id, mid in rows:
        append_thread(
            db,
            case.key,
            "delivery.failed",
            {
                "outbox_id": outbox_id,
                "kind": "contract",
                "type": "handoff.request",
                "id": mid,
                "detail": "abandoned at the handoff's deadline (PROFILE §8)",
            },
            at=now,
        )


@dataclass(frozen=True)
class _Original:
    """The recorded mail a send answers: whom the send goes to, and how it threads."""

    message_ref: str
    recipient: Recipient
    message_id: str | None
    references: tuple[str, ...]
    subject: str | None


def _recipient(
    db: Database, case: CaseView, reply_to: str | None, recorded: _Recorded | None = None
) -> _Original | None:
    if recorded is not None and recorded.case_key == case.key:
        ev = recorded.event
        # The very row the queries below would find: the mail reply_to names,
        # or the participant's latest mail on a case that has no other mail.
        if reply_to is not None:
            fresh = reply_to == ev.message_ref
        else:
            fresh = recorded.opened and case.participant == ev.from_address
        if fresh:
            recipient = Recipient(ev.from_address, ev.dmarc == "pass", ev.automated)
            return _Original(ev.message_ref, recipient, ev.message_id, ev.references, ev.subject)
    if reply_to is not None:
        row = _row(
            db,
            "SELECT message_ref, from_address, event FROM messages "
            "WHERE message_ref = ? AND case_key = ?",
            (reply_to, case.key),
        )
    else:
        # PROFILE §4: replies thread to "the participant's latest mail on the case".
        row = _row(
            db,
            "SELECT message_ref, from_address, event FROM messages "
            "WHERE case_key = ? AND lower(from_address) = lower(?) "
            "ORDER BY received_at DESC, rowid DESC LIMIT 1",
            (case.key, case.participant),
        )
    if row is None:
        return None
    event = json.loads(row["event"])
    recipient = Recipient(
        address=row["from_address"] or "",
        authenticated=event.get("auth", {}).get("dmarc") == "pass",
        automated=bool(event.get("automated", {}).get("is")),
    )
    return _Original(
        row["message_ref"],
        recipient,
        event.get("message_id"),
        tuple(event.get("references", [])),
        event.get("subject"),
    )


def _send_mail(
    rt: Runtime,
    db: Database,
    case: CaseView,
    s: SendMail,
    now: float,
    *,
    recorded: _Recorded | None = None,
) -> str | None:
    """The one gate every outbound mail passes (CONTRACT §6, PROFILE §3, §4).

    ``recorded``: the mail the running job has just recorded, which the send
    may answer (see :class:`_Recorded`).
    """
    original = _recipient(db, case, s.reply_to, recorded)
    recipient = original.recipient if original is not None else None
    typ = rt.type_config(case.domain, case.type)
    caps = Caps(typ.send_cap.per_case, typ.send_cap.per_recipient_per_day)
    # The counts feed only the caps, which decide_send checks last: a send
    # refused before any mail is counted is refused for the same reason
    # whatever the counts, so they are read only for a send that passed the
    # rules on who the recipient is.
    refusal = decide_send(recipient, Counts(0, 0), caps)
    if refusal is None and recipient is not None:
        counts = Counts(
            case_sent=db.execute(
                "SELECT sent_count FROM cases WHERE key = ?", (case.key,)
            ).fetchone()[0],
            recipient_sent_24h=db.execute(
                "SELECT COUNT(*) FROM send_log WHERE recipient = ? AND at > ?",
                (recipient.address.lower(), now - CAP_WINDOW_SECONDS),
            ).fetchone()[0],
        )
        refusal = decide_send(recipient, counts, caps)
    if refusal is not None or original is None or recipient is None:
        append_thread(
            db,
            case.key,
            "mail.refused",
            {
                "reason": refusal,
                "purpose": s.purpose,
                "to": recipient.address if recipient else None,
                "reply_to": s.reply_to,
            },
            at=now,
        )
        # Routine (most senders are unauthenticated or automated); the thread
        # keeps it, and the LMTP or HTTP edge logs the input that caused it.
        log.debug("send refused case=%s purpose=%s reason=%s", case.key, s.purpose, refusal)
        return refusal
    refs = [*original.references, original.message_id]
    subject = s.subject or compose.reply_subject(original.subject)
    mid = compose.message_id(rt.new_id(), case.domain)
    raw = compose.render(
        compose.OutboundMail(
            sender=case.address,
            to=recipient.address,
            subject=subject,
            body=s.body,
            message_id=mid,
            in_reply_to=original.message_id,
            references=[r for r in refs if r],
            auto_submitted=s.auto_submitted,
            date=now,
        )
    )
    payload = {
        "mail_from": case.address,
        "rcpt_to": recipient.address,
        "domain": case.domain,
        "message": raw.decode("utf-8"),
    }
    _queue_outbox(rt, db, "mail", f"{case.key}|smtp", "smtp", case.key, None, payload, now)
    db.execute("UPDATE cases SET sent_count = sent_count + 1 WHERE key = ?", (case.key,))
    db.execute(
        "INSERT INTO send_log (case_key, recipient, at) VALUES (?, ?, ?)",
        (case.key, recipient.address.lower(), now),
    )
    append_thread(
        db,
        case.key,
        "mail.out",
        {
            "message_id": mid,
            "to": recipient.address,
            "purpose": s.purpose,
            "subject": compose.clean_header(subject),
            "in_reply_to": original.message_ref,
            "auto_submitted": s.auto_submitted,
            "body": s.body,
        },
        at=now,
    )
    # The outbox logs the attempt to send it (``outbox sent|retry|gave-up``).
    log.debug("mail queued case=%s purpose=%s message_id=%s", case.key, s.purpose, mid)
    return None


# --------------------------------------------------------------------------- housekeeping

#: Delivered outbox rows are kept this long (for the read side and debugging).
DONE_OUTBOX_KEPT = 7 * 24 * 3600


#: Rows purged per table in one store job: a job holds the writer, so a large
#: backlog (a store that was offline for days) goes in many short jobs, each
#: with a small statement journal, with deliveries in between.
PURGE_BATCH = 1000


def purge(db: Database, now: float, limit: int = PURGE_BATCH) -> dict[str, int]:
    """Forget what no rule needs any more, at most ``limit`` rows per table;
    returns the rows removed per table (``limit`` for one: call again).

    PROFILE §2 keeps delivery dedupe 7 days and PROFILE §6 keeps idempotency
    ids "at least 7 days"; delivered outbox rows go after 7 days.  Cases,
    messages, threads and failed outbox rows are kept.
    """
    removed = {
        "deliveries": db.execute(
            "DELETE FROM deliveries WHERE rowid IN "
            "(SELECT rowid FROM deliveries WHERE at < ? LIMIT ?)",
            (now - DEDUPE_WINDOW, limit),
        ).rowcount,
        "idempotency": db.execute(
            "DELETE FROM idempotency WHERE rowid IN "
            "(SELECT rowid FROM idempotency WHERE at < ? LIMIT ?)",
            (now - IDEMPOTENCY_WINDOW, limit),
        ).rowcount,
        "outbox": db.execute(
            "DELETE FROM outbox WHERE id IN "
            "(SELECT id FROM outbox WHERE state = 'done' AND created_at < ? LIMIT ?)",
            (now - DONE_OUTBOX_KEPT, limit),
        ).rowcount,
    }
    return removed
