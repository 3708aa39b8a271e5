"""Where inputs meet the store: load state, call the engine, apply its effects.

Every public function here runs inside one store job (the writer thread, one
transaction per input; see :mod:`masd.store`).  It reads the case's state,
asks the pure engine (:mod:`masd.core.engine`) what follows, and applies the
effects, so an input and everything it causes commit together.

Principle 10 (CONTRACT §6) is enforced in :func:`_send_mail`, the one place
every outbound mail passes through.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from masd.config import Config, TypeConfig
from masd.core import compose
from masd.core.address import Address
from masd.core.engine import (
    AbandonRequest,
    CaseView,
    Context,
    CreateCase,
    Effect,
    EndpointView,
    HandoffView,
    OpenHandoff,
    Reply,
    SendContract,
    SendMail,
    Status,
    Thread,
    TypeView,
    master_deadline,
    master_mail,
    request_failed,
    status_from_mode,
)
from masd.core.errors import MasdError, TransitionError, WireError
from masd.core.event import ParsedMail
from masd.core.principle10 import CAP_WINDOW_SECONDS, Caps, Counts, Recipient, decide_send
from masd.core.status import MACHINE
from masd.core.wire import Envelope, HandoffStatus, decode
from masd.peers import Directory, Principal, mode_peer_id, peers_of
from masd.store.schema import append_thread, dumps, next_number

log = logging.getLogger("masd")

#: PROFILE §2: the same message delivered again within 7 days is recorded once.
DEDUPE_WINDOW = 7 * 24 * 3600
#: PROFILE §6: "ids are kept at least 7 days".
IDEMPOTENCY_WINDOW = 7 * 24 * 3600


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

    def __post_init__(self) -> None:
        self.directory = Directory(peers_of(self.config))
        self.status_url = self.config.server.public_url.rstrip("/") + "/mas/v0.1/messages"

    def context(self, now: float) -> Context:
        return Context(now=now, new_id=self.new_id, status_url=self.status_url)

    def type_config(self, domain: str, type_: str) -> TypeConfig:
        typ = self.config.type_for(domain, type_)
        if typ is None:
            raise UnknownCase(f"no type {type_!r} at {domain}")
        return typ

    def type_view(self, domain: str, type_: str) -> TypeView:
        typ = self.type_config(domain, type_)
        endpoints = {
            mode: EndpointView(mode_peer_id(domain, type_, mode), ep.url, ep.deadline, ep.fields)
            for mode, ep in typ.endpoints.items()
        }
        return TypeView(
            role="master" if typ.role == "master" else "slave",
            modes=frozenset(typ.modes),
            endpoints=endpoints,
            acknowledge=typ.acknowledge,
            require_dmarc_for_handoff=typ.require_dmarc_for_handoff,
            id_prefix=typ.id_prefix,
        )

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


def _handoff(rt: Runtime, db: Database, row: Mapping[str, Any]) -> HandoffView:
    needs: tuple[str, ...] = ()
    if row["status"] == "negotiating":
        last = _row(
            db,
            "SELECT data FROM statuses WHERE handoff_id = ? ORDER BY n DESC LIMIT 1",
            (row["handoff_id"],),
        )
        if last:
            needs = tuple(json.loads(last["data"]).get("needs") or ())
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
    row = _row(db, "SELECT * FROM cases WHERE key = ?", (key,))
    if row is None:
        return None
    h = _row(
        db,
        "SELECT * FROM handoffs WHERE case_key = ? AND closed_at IS NULL "
        "ORDER BY requested_at DESC LIMIT 1",
        (key,),
    )
    return CaseView(
        key=row["key"],
        address=row["address"],
        domain=row["domain"],
        type=row["type"],
        id=row["id"],
        role=row["role"],
        participant=row["participant"] or "",
        open_handoff=_handoff(rt, db, h) if h else None,
    )


def load_handoff(rt: Runtime, db: Database, handoff_id: str) -> HandoffView | None:
    row = _row(db, "SELECT * FROM handoffs WHERE handoff_id = ?", (handoff_id,))
    return _handoff(rt, db, row) if row else None


def case_exists(db: Database, key: str) -> bool:
    return _row(db, "SELECT 1 AS x FROM cases WHERE key = ?", (key,)) is not None


# --------------------------------------------------------------------------- inbound mail


@dataclass(frozen=True)
class Delivered:
    message_ref: str
    case_key: str
    duplicate: bool = False


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
        return Delivered(seen["message_ref"], (m or {}).get("case_key") or "", duplicate=True)
    typ = rt.type_view(rcpt.domain, rcpt.type)
    if typ.role != "master":
        raise MasdError(
            f"type {rcpt.type} at {rcpt.domain} is a slave-role type", code="not-master"
        )
    case: CaseView | None = None
    new_case_id = ""
    if rcpt.kind == "resource":
        case = load_case(rt, db, rcpt.key)
        if case is None:
            raise UnknownCase(f"no case {rcpt.key}")
    else:
        new_case_id = f"{typ.id_prefix}{next_number(db, rcpt.domain, rcpt.type)}"
    effects = master_mail(case, rcpt, mail, typ, rt.context(now), new_case_id=new_case_id)
    if case is None:
        created = next(e for e in effects if isinstance(e, CreateCase))
        case = created.case
        _create_case(db, case, now)
    db.execute(
        "INSERT INTO messages (message_ref, case_key, rcpt_to, mail_from, message_id, "
        "from_address, sha256, size, raw, event, received_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (
            ev.message_ref,
            case.key,
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
    apply(rt, db, case, [e for e in effects if not isinstance(e, CreateCase)], now)
    return Delivered(ev.message_ref, case.key)


def _create_case(db: Database, case: CaseView, now: float) -> None:
    db.execute(
        "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at) "
        "VALUES (?,?,?,?,?,?,?,?)",
        (case.key, case.address, case.domain, case.type, case.id, case.role, case.participant, now),
    )


# --------------------------------------------------------------------------- contract messages in


def receive(
    rt: Runtime, db: Database, who: Principal, env: Envelope, now: float
) -> tuple[int, Mapping[str, Any]]:
    """A contract message that passed authentication and the envelope checks.

    PROFILE §6 order from here: idempotency, schema, unknown case/handoff,
    forbidden, stale seq, invalid transition.  Every answer but a 5xx is
    kept for the (peer, id), so a repeat gets the original status and body.
    """
    kept = _row(
        db, "SELECT status, body FROM idempotency WHERE peer = ? AND id = ?", (who.id, env.id)
    )
    if kept is not None:
        return int(kept["status"]), json.loads(kept["body"])
    try:
        reply = _dispatch(rt, db, who, env, now)
        status, body = reply.status, dict(reply.body)
    except WireError as exc:
        status, body = exc.status, {"ok": False, "error": exc.code, "detail": exc.detail}
    except TransitionError as exc:
        status, body = 409, {"ok": False, "error": exc.code, "detail": exc.detail}
    db.execute(
        "INSERT INTO idempotency (peer, id, status, body, at) VALUES (?, ?, ?, ?, ?)",
        (who.id, env.id, status, dumps(body), now),
    )
    return status, body


def _dispatch(rt: Runtime, db: Database, who: Principal, env: Envelope, now: float) -> Reply:
    msg = decode(env)
    if isinstance(msg, HandoffStatus):
        handoff = load_handoff(rt, db, msg.handoff_id)
        if not case_exists(db, msg.case.key):
            raise WireError(f"case.key: no case {msg.case.key}", code="unknown-case", status=404)
        if handoff is None or handoff.case_key != msg.case.key:
            raise WireError(
                f"handoff_id: no handoff {msg.handoff_id} on case {msg.case.key}",
                code="unknown-handoff",
                status=404,
            )
        if not who.covers(handoff.peer):
            raise WireError(
                f"handoff_id: {msg.handoff_id} was not sent to this peer",
                code="forbidden",
                status=403,
            )
        case = load_case(rt, db, msg.case.key)
        assert case is not None
        reply = status_from_mode(case, handoff, msg, resume=case.role == "master")
        apply(rt, db, case, reply.effects, now)
        return reply
    raise WireError(
        f"type: {env.type} is for slave-role types, not served here", code="forbidden", status=403
    )


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


def fire_deadline(rt: Runtime, db: Database, handoff_id: str, now: float) -> bool:
    """CONTRACT §3.1.2 / PROFILE §8 for one handoff; False if nothing was due."""
    handoff = load_handoff(rt, db, handoff_id)
    if handoff is None or handoff.closed:
        return False
    case = load_case(rt, db, handoff.case_key)
    assert case is not None
    apply(rt, db, case, master_deadline(case, handoff, rt.context(now)), now)
    return True


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


def due_outbox(
    db: Database, now: float, limit: int = 64, exclude: Iterable[str] = ()
) -> list[OutboxItem]:
    """The head of each queue whose time has come (PROFILE §7: in order per case and peer)."""
    busy = list(exclude)
    rows = db.execute(
        "SELECT o.id, o.kind, o.queue, o.peer, o.case_key, o.url, o.payload, o.attempts, "
        "o.deliver_until FROM outbox o WHERE o.state = 'pending' AND o.next_attempt_at <= ? "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at, o.id LIMIT ?",
        (now, limit + len(busy)),
    ).fetchall()
    items = [OutboxItem(*r) for r in rows if r[2] not in busy]
    return items[:limit]


def next_outbox_at(db: Database, busy: Iterable[str] = ()) -> float | None:
    """When the next queue head not in ``busy`` falls due.

    Not the earliest pending row: a row behind a head in backoff is not due.
    """
    skip = set(busy)
    rows = db.execute(
        "SELECT o.queue, o.next_attempt_at FROM outbox o WHERE o.state = 'pending' "
        "AND o.id = (SELECT MIN(id) FROM outbox WHERE queue = o.queue AND state = 'pending') "
        "ORDER BY o.next_attempt_at LIMIT ?",
        (len(skip) + 1,),
    ).fetchall()
    times = [float(at) for queue, at in rows if queue not in skip]
    return times[0] if times else None


def outbox_done(db: Database, item_id: int, now: float) -> None:
    db.execute(
        "UPDATE outbox SET state = 'done', attempts = attempts + 1, last_error = NULL WHERE id = ?",
        (item_id,),
    )


def backoff(attempts: int, rng: random.Random | None = None) -> float:
    """PROFILE §7: "exponential backoff from 1 s to 5 min with jitter"."""
    base = min(300.0, 2.0 ** max(0, attempts - 1))
    return base * (0.5 + (rng or random).random() / 2)


def outbox_retry(rt: Runtime, db: Database, item: OutboxItem, error: str, now: float) -> bool:
    """A failure worth retrying; gives up (and fails the item) after ``retry_for``."""
    next_at = now + backoff(item.attempts + 1)
    if next_at > item.deliver_until:
        outbox_failed(rt, db, item, f"gave up after {item.attempts + 1} attempts: {error}", now)
        return False
    db.execute(
        "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? "
        "WHERE id = ?",
        (error[:1000], next_at, item.id),
    )
    return True


def outbox_failed(rt: Runtime, db: Database, item: OutboxItem, detail: str, now: float) -> None:
    """PROFILE §7: "4xx: not retried; recorded in the thread as a failed delivery
    (a refused handoff.request records failed with the detail and resumes by
    email)"."""
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
            if handoff is not None:
                effects = request_failed(case, handoff, detail)
    else:
        data["to"] = json.loads(item.payload).get("rcpt_to")
    append_thread(db, case.key, "delivery.failed", data, at=now)
    apply(rt, db, case, effects, now)


# --------------------------------------------------------------------------- applying effects


def apply(
    rt: Runtime, db: Database, case: CaseView, effects: Iterable[Effect], now: float
) -> list[str | None]:
    """Carry out the engine's effects on ``case``; returns each SendMail's refusal (or None)."""
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
        elif isinstance(effect, Status):
            _record_status(db, case, effect, now)
        elif isinstance(effect, SendContract):
            _queue_contract(rt, db, case, effect, now)
        elif isinstance(effect, SendMail):
            refusals.append(_send_mail(rt, db, case, effect, now))
        elif isinstance(effect, AbandonRequest):
            _abandon_request(db, case, effect.handoff_id, now)
    return refusals


def _record_status(db: Database, case: CaseView, s: Status, now: float) -> None:
    n = db.execute(
        "SELECT COALESCE(MAX(n), 0) + 1 FROM statuses WHERE handoff_id = ?", (s.handoff_id,)
    ).fetchone()[0]
    db.execute(
        "INSERT INTO statuses (handoff_id, n, seq, status, source, data, at) "
        "VALUES (?,?,?,?,?,?,?)",
        (s.handoff_id, n, s.seq, s.status, s.source, dumps(dict(s.fields)), now),
    )
    terminal = MACHINE.is_terminal(s.status)
    db.execute(
        "UPDATE handoffs SET status = ?, last_seq = COALESCE(?, last_seq), "
        "closed_at = CASE WHEN ? THEN ? ELSE closed_at END WHERE handoff_id = ?",
        (s.status, s.seq, terminal, now, s.handoff_id),
    )
    mode = db.execute("SELECT mode FROM handoffs WHERE handoff_id = ?", (s.handoff_id,)).fetchone()[
        0
    ]
    entry = {"handoff_id": s.handoff_id, "mode": mode, "status": s.status, "source": s.source}
    if s.seq is not None:
        entry["seq"] = s.seq
    entry.update(s.fields)
    append_thread(db, case.key, "status", entry, at=now)
    log.info(
        "status case=%s handoff=%s status=%s seq=%s source=%s",
        case.key,
        s.handoff_id,
        s.status,
        s.seq,
        s.source,
    )


def _queue_contract(rt: Runtime, db: Database, case: CaseView, s: SendContract, now: float) -> None:
    message = dict(s.message)
    db.execute(
        "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
        "next_attempt_at, deliver_until) VALUES ('contract', ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            f"{case.key}|{s.peer}",
            s.peer,
            case.key,
            s.url,
            dumps(message),
            now,
            now,
            now + rt.config.server.retry_for,
        ),
    )
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


def _recipient(
    db: Database, case: CaseView, reply_to: str | None
) -> tuple[Recipient | None, dict[str, Any] | None]:
    if reply_to is not None:
        row = _row(
            db,
            "SELECT message_ref, message_id, from_address, event FROM messages "
            "WHERE message_ref = ? AND case_key = ?",
            (reply_to, case.key),
        )
    else:
        # PROFILE §4: replies thread to "the participant's latest mail on the case".
        row = _row(
            db,
            "SELECT message_ref, message_id, from_address, event FROM messages "
            "WHERE case_key = ? AND lower(from_address) = lower(?) "
            "ORDER BY received_at DESC, rowid DESC LIMIT 1",
            (case.key, case.participant),
        )
    if row is None:
        return None, None
    event = json.loads(row["event"])
    recipient = Recipient(
        address=row["from_address"] or "",
        authenticated=event.get("auth", {}).get("dmarc") == "pass",
        automated=bool(event.get("automated", {}).get("is")),
    )
    return recipient, row | {"event": event}


def _send_mail(rt: Runtime, db: Database, case: CaseView, s: SendMail, now: float) -> str | None:
    """The one gate every outbound mail passes (CONTRACT §6, PROFILE §3, §4)."""
    recipient, row = _recipient(db, case, s.reply_to)
    typ = rt.type_config(case.domain, case.type)
    counts = Counts(0, 0)
    if recipient is not None and recipient.address:
        counts = Counts(
            case_sent=db.execute(
                "SELECT sent_count FROM cases WHERE key = ?", (case.key,)
            ).fetchone()[0],
            recipient_sent_24h=db.execute(
                "SELECT COUNT(*) FROM send_log WHERE recipient = ? AND at > ?",
                (recipient.address.lower(), now - CAP_WINDOW_SECONDS),
            ).fetchone()[0],
        )
    refusal = decide_send(
        recipient, counts, Caps(typ.send_cap.per_case, typ.send_cap.per_recipient_per_day)
    )
    if refusal is not None or recipient is None or row is None:
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
        log.info("send refused case=%s purpose=%s reason=%s", case.key, s.purpose, refusal)
        return refusal
    event = row["event"]
    refs = [*event.get("references", []), event.get("message_id")]
    mid = compose.message_id(rt.new_id(), case.domain)
    raw = compose.render(
        compose.OutboundMail(
            sender=case.address,
            to=recipient.address,
            subject=s.subject or compose.reply_subject(event.get("subject")),
            body=s.body,
            message_id=mid,
            in_reply_to=event.get("message_id"),
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
    db.execute(
        "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
        "next_attempt_at, deliver_until) VALUES ('mail', ?, 'smtp', ?, NULL, ?, ?, ?, ?)",
        (f"{case.key}|smtp", case.key, dumps(payload), now, now, now + rt.config.server.retry_for),
    )
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
            "subject": compose.clean_header(
                s.subject or compose.reply_subject(event.get("subject"))
            ),
            "in_reply_to": row["message_ref"],
            "auto_submitted": s.auto_submitted,
            "body": s.body,
        },
        at=now,
    )
    log.info("mail queued case=%s purpose=%s message_id=%s", case.key, s.purpose, mid)
    return None
