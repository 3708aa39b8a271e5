"""What masd would do with one mail, without doing it (``masd explain FILE.eml``).

A dry run of one LMTP delivery through the code a real one goes through: the
recipient decided by the LMTP listener's own check
(:func:`masd.edges.lmtp_recipient.recipient_check`, its store question put to
the store read-only), the size by :func:`masd.edges.lmtp_replies.size_refusal`,
the mail read with its trust verdicts (:func:`masd.core.event.build_event`,
:func:`masd.core.trust.trusted_block`), a mail to a bounce address read as the
bounce reader reads it (:func:`masd.service.bounce_mail.read`) and its tag
checked as delivery checks it (:func:`masd.service.bounce_mail.check`), the
role engine's effects (:func:`masd.core.engine.master_mail`,
:mod:`masd.core.slave`) on the case as the store holds it, and each send
through Principle 10 (:func:`masd.core.principle10.decide_send`).  It writes
nothing and sends nothing; the store is opened only when the recipient is a
case or bounce address.  What is still assumed is said: no mail has been sent
on the case yet (the send caps count from zero); a slave case has its type's
default policy; the mail is not a repeat of one already recorded.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Final

from masd.config import Config
from masd.core.address import Address
from masd.core.engine import (
    CaseView,
    CreateCase,
    Effect,
    OpenHandoff,
    OpenIntake,
    SendContract,
    SendMail,
    Status,
    Thread,
    master_mail,
)
from masd.core.event import ParsedMail, build_event, parse_headers
from masd.core.principle10 import Caps, Counts, Recipient, decide_send
from masd.core.rfc5322 import mailboxes
from masd.core.slave import slave_intake, slave_mail
from masd.core.times import rfc3339
from masd.core.trust import trusted_block
from masd.edges.lmtp_recipient import RecipientCheck, SyncReader, check_recipient_sync
from masd.edges.lmtp_replies import Replies, size_refusal
from masd.service import Runtime, bounce_mail
from masd.service.runtime import Job
from masd.service.state import load_case
from masd.store import Tx, bounces

#: The id a new case would get, shown in its place (the next number is in the store).
NEW_ID = "N"
#: Fresh random ids (handoffs, messages) are shown as this.
FRESH = "(new id)"


@dataclass
class Explained:
    """What masd would do; :meth:`json` is ``masd explain --json``."""

    recipient: dict[str, Any]
    lmtp: str
    mail: dict[str, Any] = field(default_factory=dict)
    trust: dict[str, Any] = field(default_factory=dict)
    automated: dict[str, Any] = field(default_factory=dict)
    participant: str | None = None
    caps: dict[str, int] = field(default_factory=dict)
    would: list[dict[str, Any]] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        return {
            "recipient": self.recipient,
            "lmtp": self.lmtp,
            "mail": self.mail,
            "trust": self.trust,
            "automated": self.automated,
            "participant": self.participant,
            "caps": self.caps,
            "would": self.would,
            "assumed": self.assumed,
        }


class MailFileError(Exception):
    """The file given to ``masd explain`` cannot be read as a mail."""


#: What a file that is not a regular one is, by its type.
_KINDS: Final[tuple[tuple[Callable[[int], bool], str], ...]] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def read_mail(path: str, limit: int, stdin: IO[bytes]) -> bytes:
    """The mail in ``path`` (``-``: ``stdin``), read to at most ``limit`` + 1 octets
    (one more tells that it is over ``server.max_message_bytes``).

    Only a regular file is read (a device such as ``/dev/zero`` never ends): anything
    else is a :class:`MailFileError` naming it.  The file is opened without blocking,
    so a named pipe is refused rather than waited on.
    """
    if path == "-":
        return stdin.read(limit + 1)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise MailFileError(f"{path}: cannot open: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise MailFileError(f"{path}: not a regular file ({kind}); give a mail's file or -")
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit + 1)


def default_recipient(raw: bytes, config: Config) -> str | None:
    """The first address at a configured domain in ``Delivered-To``,
    ``X-Original-To``, ``To`` or ``Cc`` (in that order), or None."""
    headers = parse_headers(raw)
    for wanted in ("delivered-to", "x-original-to", "to", "cc"):
        values = [v for n, v in headers if n.lower() == wanted]
        for box in (box for value in values for box in mailboxes(value)):
            if box.address.rpartition("@")[2].lower() in config.domains:
                return box.address
    return None


def _no_store(fn: Callable[[Tx], Any], /) -> Any:
    raise RuntimeError("no store was given to read")


def explain(
    config: Config,
    raw: bytes,
    rcpt: str,
    *,
    mail_from: str | None = None,
    now: float,
    read: SyncReader = _no_store,
) -> Explained:
    """Explain the delivery of ``raw`` to ``rcpt`` (envelope sender ``mail_from``,
    by default the mail's From); ``read`` reads the store (only for a case or bounce
    address, as the LMTP listener does)."""
    shown: dict[str, Any] = {"address": rcpt}
    check, reply, text = check_recipient_sync(config, read, rcpt)
    addr = check.addr
    if addr is not None:
        shown.update(_parsed(addr))
    typ = None if addr is None else config.type_for(addr.domain, addr.type)
    if reply is not Replies.RECIPIENT_OK or addr is None or typ is None:
        return Explained(shown, reply.line(text))
    shown["role"] = typ.role
    too_big = size_refusal(len(raw), config.server.max_message_bytes)
    if too_big is not None:
        return Explained(shown, Replies.TOO_BIG.line(too_big))
    rt = Runtime(config, new_id=lambda: FRESH)
    mail = build_event(
        raw,
        mail_from=mail_from if mail_from is not None else _from_header(raw),
        rcpt_to=rcpt,
        received_at=rfc3339(now) or "",
        message_ref="msg-explain",
        trust=rt.trust(),
    )
    out = Explained(shown, Replies.RECORDED.line("would be recorded"))
    out.caps = {
        "per_case": typ.send_cap.per_case,
        "per_recipient_per_day": typ.send_cap.per_recipient_per_day,
    }
    effects, case, mail = _delivery(rt, check, read, mail, raw, out, now)
    out.mail = _mail(mail)
    out.trust = _trust(raw, mail, rt)
    out.automated = {"is": mail.automation.is_automated, "reason": mail.automation.reason}
    out.participant = case.participant if case is not None else None
    caps = Caps(typ.send_cap.per_case, typ.send_cap.per_recipient_per_day)
    out.would[:0] = [_effect(e, mail, caps) for e in effects]
    return out


@dataclass(frozen=True)
class _Found:
    """What the store holds for a case or bounce address, read in one transaction."""

    case: CaseView | None
    outbox_id: int | None = None
    sent: tuple[int, str] | None = None


def _read_case(
    rt: Runtime, tx: Tx, check: RecipientCheck, raw: bytes, done: bounce_mail.Read, now: float
) -> tuple[_Found, bounce_mail.Read]:
    assert check.addr is not None
    case = load_case(rt, tx, check.addr.key)
    if case is None or check.bounce is None:
        return _Found(case), done
    outbox_id, report = bounce_mail.check(Job(rt, tx, now), case, check.bounce, raw, done)
    sent = bounces.mail_out(tx, case.key, outbox_id)
    return _Found(case, outbox_id, sent), bounce_mail.Read(report)


def _delivery(
    rt: Runtime,
    check: RecipientCheck,
    read: SyncReader,
    mail: ParsedMail,
    raw: bytes,
    out: Explained,
    now: float,
) -> tuple[list[Effect], CaseView | None, ParsedMail]:
    """What delivery does at DATA (masd.service.intake.deliver's branches): the effects,
    the case, and the mail as it is recorded (a bounce address's no-bounce: automated)."""
    addr = check.addr
    assert addr is not None
    if addr.kind != "resource":
        return *_effects(rt, addr, mail, None, out, now), mail
    # The bounce reader's reading, before the store job, as at the LMTP edge.
    done = bounce_mail.read(raw) if check.bounce is not None else bounce_mail.Read(None)
    found, done = read(lambda tx: _read_case(rt, tx, check, raw, done, now))
    if found.case is None:  # erased since RCPT: delivery would answer 550 too
        out.lmtp = Replies.UNKNOWN_CASE.line(f"no case {addr.key}")
        return [], None, mail
    case = found.case
    if check.bounce is None:
        return *_effects(rt, addr, mail, case, out, now), mail
    if done.report is None:
        mail = bounce_mail.automated_as(mail, bounce_mail.NOT_A_BOUNCE)
        return *_effects(rt, addr, mail, case, out, now), mail
    entry = bounce_mail.bounced_entry(found.sent, mail.event.message_ref, done.report)
    effects: list[Effect] = [Thread("mail.bounced", entry)]
    if found.sent and done.report.permanent:  # it failed for good: suppressed
        out.would.append({"do": "suppress", "address": found.sent[1]})
    return effects + bounce_mail.told_master(rt, case, mail), case, mail


def _parsed(addr: Address) -> dict[str, Any]:
    return {
        "kind": addr.kind,
        "type": addr.type,
        "id": addr.id,
        "mode": addr.mode,
        "domain": addr.domain,
        "canonical": addr.canonical,
        "key": addr.key,
    }


def _from_header(raw: bytes) -> str:
    """The envelope sender to assume: the first From address (or the null sender)."""
    values = [v for n, v in parse_headers(raw) if n.lower() == "from"]
    found = [box for value in values for box in mailboxes(value)]
    return found[0].address if found else ""


def _mail(mail: ParsedMail) -> dict[str, Any]:
    ev = mail.event
    return {
        "mail_from": ev.mail_from,
        "from": ev.from_address,
        "from_addresses": list(mail.from_addresses),
        "subject": ev.subject,
        "message_id": ev.message_id,
    }


def _trust(raw: bytes, mail: ParsedMail, rt: Runtime) -> dict[str, Any]:
    """The trusted block (the headers masd believes), its A-R headers, the verdict."""
    headers = parse_headers(raw)
    size = trusted_block(headers, rt.trust())
    ends = headers[size] if size < len(headers) else None
    return {
        "trusted_headers": size,
        "block_ends_at": None if ends is None else f"{ends[0]}: {ends[1]}"[:300],
        "authentication_results": [
            v[:300] for n, v in headers[:size] if n.lower() == "authentication-results"
        ],
        "chosen": mail.auth.authserv_id,
        "dmarc": mail.auth.dmarc,
        "header_from": mail.auth.header_from,
        "authenticated": mail.auth.authenticated,
        "reason": mail.auth.reason,
        "cause": mail.cause.cause,
        "cause_detail": mail.cause.detail,
    }


def _effects(
    rt: Runtime,
    addr: Address,
    mail: ParsedMail,
    case: CaseView | None,
    out: Explained,
    now: float,
) -> tuple[list[Effect], CaseView | None]:
    """The engine's effects on ``case`` (None: the address opens one)."""
    view = rt.type_view(addr.domain, addr.type)
    ctx = rt.context(now)
    if view.role == "slave":
        master = rt.master_of(addr.domain, addr.type)
        if case is None:
            return [slave_intake(addr, mail, ctx, master=master)], None
        policy = rt.default_policy(addr.domain, addr.type)
        out.assumed.append("the case has its type's default policy")
        return slave_mail(
            case, addr, mail, rt.slave_terms(case.domain, case.type, policy), ctx
        ), case
    new_id = f"{view.id_prefix}{NEW_ID}"
    effects = master_mail(case, addr, mail, view, ctx, new_case_id=new_id)
    if case is None:
        out.assumed.append(f"{NEW_ID}: the next case number of {addr.type} at {addr.domain}")
        case = next(e.case for e in effects if isinstance(e, CreateCase))
    out.assumed.append("no mail was sent on the case yet (the send caps count from zero)")
    return effects, case


def _effect(e: Effect, mail: ParsedMail, caps: Caps) -> dict[str, Any]:
    """One effect, as data an operator reads."""
    name = type(e).__name__
    if isinstance(e, SendMail):
        ev = mail.event
        recipient = Recipient(
            ev.from_address, mail.auth.authenticated, mail.automation.is_automated
        )
        refusal = decide_send(recipient, Counts(0, 0), caps)
        return {
            "do": "send-mail",
            "purpose": e.purpose,
            "to": ev.from_address or None,
            "sent": refusal is None,
            "refused": refusal,
        }
    if isinstance(e, CreateCase):
        return {"do": "open-case", "address": e.case.address, "participant": e.case.participant}
    if isinstance(e, Thread):
        return {"do": "thread", "kind": e.kind, **_brief(e.data)}
    if isinstance(e, OpenHandoff):
        return {
            "do": "open-handoff",
            "mode": e.mode,
            "peer": e.peer,
            "deadline_at": rfc3339(e.deadline_at),
        }
    if isinstance(e, Status):
        return {"do": "status", "status": e.status, "source": e.source, **dict(e.fields)}
    if isinstance(e, SendContract):
        return {"do": "send-contract", "type": e.message.get("type"), "to": e.peer, "url": e.url}
    if isinstance(e, OpenIntake):
        return {
            "do": "send-contract",
            "type": "case.intake",
            "to": e.master.peer,
            "url": e.master.url,
            "requested_mode": e.requested_mode,
        }
    return {"do": name}


_BRIEF: Final = ("from", "subject", "dmarc", "automated", "requested_mode", "type")
#: and of a mail.bounced entry
_BRIEF_BOUNCE: Final = ("recipient", "status", "permanent", "claimed_recipient")


def _brief(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in (*_BRIEF, *_BRIEF_BOUNCE) if k in data}


# --------------------------------------------------------------------------- text


def _line(w: Mapping[str, Any]) -> str:
    do = w["do"]
    if do == "send-mail":
        verdict = "would be sent" if w["sent"] else f"refused: {w['refused']}"
        return f"mail the {w['purpose']} to {w['to'] or '(no address)'}: {verdict}"
    if do == "open-case":
        return f"open case {w['address']} (participant {w['participant'] or '(none)'})"
    if do == "thread":
        extra = " ".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v)}"
            for k, v in w.items()
            if k not in ("do", "kind")
        )
        return f"record {w['kind']} {extra}".rstrip()
    if do == "open-handoff":
        if w["peer"] == "email":
            return f"open handoff {w['mode']}, refused on the spot"
        return f"open handoff {w['mode']} to {w['peer']} (deadline {w['deadline_at']})"
    if do == "status":
        reason = f" (reason {w['reason']})" if w.get("reason") else ""
        return f"status {w['status']} by {w['source']}{reason}"
    if do == "send-contract":
        return f"send {w['type']} to {w['to']} at {w['url']}"
    if do == "suppress":
        return f"suppress {w['address']} (masd's own mail to it refused for server.suppress_for)"
    return str(do)


def format_explained(x: Explained) -> str:
    """``masd explain``: one section per question, then what masd would do."""
    r = x.recipient
    lines = [f"recipient    {r['address']}"]
    if "kind" in r:
        mode = f", mode {r['mode']}" if r["mode"] else ""
        lines.append(f"  parsed     {r['kind']} {r['canonical']}{mode} (key {r['key']})")
    if "role" in r:
        lines.append(f"  role       {r['role']}")
    lines.append(f"  LMTP       {x.lmtp}")
    if not x.mail:
        return "\n".join(lines) + "\n"
    m, t, a = x.mail, x.trust, x.automated
    lines += [
        f"sender       From {m['from'] or '(none)'} (envelope {m['mail_from'] or '<>'})",
        f"trust        {t['trusted_headers']} header(s) in the trusted block"
        + (f", ending at {t['block_ends_at']}" if t["block_ends_at"] else ""),
        *(f"  A-R        {v}" for v in t["authentication_results"]),
        f"  chosen     {t['chosen'] or '(none)'}",
        f"dmarc        {t['dmarc']} ({t['reason']})",
        f"cause        {t['cause']}: {t['cause_detail']}",
        f"automated    {'yes: ' + str(a['reason']) if a['is'] else 'no'}",
        f"participant  {x.participant or '(none)'}",
        f"caps         {x.caps['per_case']} per case, "
        f"{x.caps['per_recipient_per_day']} per recipient a day",
        "would",
        *(f"  - {_line(w)}" for w in x.would),
    ]
    if x.assumed:
        lines += ["assumed (what a dry run cannot know)", *(f"  - {s}" for s in x.assumed)]
    return "\n".join(lines) + "\n"
