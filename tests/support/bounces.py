"""Bounces for the tests: a DSN as Postfix writes it, and delivering one back to masd."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

from masd import service
from masd.core.address import parse_address
from masd.core.bounce import bounce_address, make_tag, split_bounce
from masd.core.event import build_event
from masd.core.times import rfc3339
from masd.core.trust import TrustSettings
from masd.store import Store, bounces


def postfix_dsn(
    envelope_to: str,
    recipient: str,
    *,
    status: str = "5.1.1",
    action: str = "failed",
    remote_mta: str | None = "mx.example.net",
    reporting_mta: str = "mx.help.example",
) -> bytes:
    """A delivery status notification in the layout of Postfix's bounce(8)."""
    boundary = f"{secrets.token_hex(6)}.1764600000/{reporting_mta}"
    said = f"550 {status} <{recipient}>: Recipient address rejected: User unknown"
    remote = [f"Remote-MTA: dns; {remote_mta}"] if remote_mta else []
    lines = [
        f"From: MAILER-DAEMON@{reporting_mta} (Mail Delivery System)",
        "Subject: Undelivered Mail Returned to Sender",
        f"To: {envelope_to}",
        "Auto-Submitted: auto-replied",
        "MIME-Version: 1.0",
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"',
        "Content-Transfer-Encoding: 8bit",
        f"Message-Id: <{secrets.token_hex(8)}@{reporting_mta}>",
        "",
        "This is a MIME-encapsulated message.",
        "",
        f"--{boundary}",
        "Content-Description: Notification",
        "Content-Type: text/plain; charset=us-ascii",
        "",
        f"This is the mail system at host {reporting_mta}.",
        "",
        f"<{recipient}>: host {remote_mta}[192.0.2.1] said: {said} (in reply to RCPT TO command)",
        "",
        f"--{boundary}",
        "Content-Description: Delivery report",
        "Content-Type: message/delivery-status",
        "",
        f"Reporting-MTA: dns; {reporting_mta}",
        "X-Postfix-Queue-ID: 4ABC123",
        f"X-Postfix-Sender: rfc822; {envelope_to}",
        "Arrival-Date: Tue,  1 Dec 2026 22:00:00 +0000 (UTC)",
        "",
        f"Final-Recipient: rfc822; {recipient}",
        f"Original-Recipient: rfc822;{recipient}",
        f"Action: {action}",
        f"Status: {status}",
        *remote,
        f"Diagnostic-Code: smtp; {said}",
        "",
        f"--{boundary}",
        "Content-Description: Undelivered Message Headers",
        "Content-Type: text/rfc822-headers",
        "",
        f"From: {envelope_to}",
        f"To: {recipient}",
        "Subject: Re: hello",
        "",
        f"--{boundary}--",
        "",
    ]
    return "\r\n".join(lines).encode("ascii")


@dataclass(frozen=True)
class SentMail:
    """A mail masd queued: its outbox id, envelope sender and recipient."""

    outbox_id: int
    mail_from: str
    rcpt_to: str


async def sent_mails(store: Store) -> list[SentMail]:
    """Every mail in the outbox, oldest first."""
    rows = await store.read(
        lambda db: db.execute(
            "SELECT id, payload FROM outbox WHERE kind = 'mail' ORDER BY id"
        ).fetchall()
    )
    out = []
    for oid, payload in rows:
        data = json.loads(payload)
        out.append(SentMail(int(oid), str(data["mail_from"]), str(data["rcpt_to"])))
    return out


async def bounce_address_of(store: Store, case: str, n: int = 1) -> str:
    """The bounce address of mail ``n`` of ``case`` (canonical, lowercase): the store's key."""
    key = await store.write(lambda db: bounces.key(db, 0.0))
    return bounce_address(case, "+", make_tag(key, case, n))


async def deliver_raw(
    store: Store, rt: service.Runtime, rcpt: str, raw: bytes, now: float, sender: str = ""
) -> service.Delivered:
    """Record ``raw`` to ``rcpt`` through the real delivery path, as the LMTP edge does."""
    config = rt.config
    trust = TrustSettings.of(config.server.trusted_authserv_ids, config.server.trusted_hosts)
    mail = build_event(
        raw,
        mail_from=sender,
        rcpt_to=rcpt,
        received_at=rfc3339(now) or "",
        message_ref=rt.new_id(),
        trust=trust,
    )
    split = split_bounce(rcpt, config.server.recipient_delimiter)
    address = parse_address(split.address if split else rcpt, domains=list(config.domains))
    sha = hashlib.sha256(raw).hexdigest()
    return await store.write(lambda db: service.deliver(rt, db, address, mail, raw, sha, now))


def bounce_case(mail_from: str, delimiter: str = "+") -> str:
    """The case address a bounce address belongs to (the envelope sender of masd's mail)."""
    split = split_bounce(mail_from, delimiter)
    assert split is not None, f"{mail_from!r} is not a bounce address"
    return split.address
