"""Fill a store directly with SQL: cases as masd records them, open handoffs, pending outbox rows.

Rows have the shape masd's own intake writes (a case, its message with a
2 KB raw body and event, the dedupe row, its thread entries), so the tables
and indexes grow as they would in service.  The fill runs with
``synchronous=OFF`` in large transactions for speed; masd reopens the file
with its own settings.  ``id_counters`` continues after the filled cases.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.masd_setup import DOMAIN, MODE_PEER
from masd.edges.lmtp import new_message_ref

BATCH = 20_000


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _body(size: int) -> str:
    lines, left, n = [], size, 0
    while left > 0:
        n += 1
        line = (str(n % 10) + "X" * 78)[: max(1, min(78, left - 2))]
        lines.append(line)
        left -= len(line) + 2
    return "\r\n".join(lines) + "\r\n"


@dataclass(frozen=True)
class Filled:
    cases: int
    open_handoffs: list[tuple[str, str]]  # (case key, handoff id)
    pending_outbox: int
    seconds: float


def _batches(first: int, last: int) -> Iterator[range]:
    for start in range(first, last + 1, BATCH):
        yield range(start, min(last, start + BATCH - 1) + 1)


def fill(
    database: Path,
    *,
    cases: int,
    open_handoffs: int = 0,
    pending_outbox: int = 0,
    status_url: str = "http://127.0.0.1:9/mas/v0.1/messages",
    sink_url: str = "http://127.0.0.1:9/mas",
    size: int = 2048,
) -> Filled:
    """Add ``cases`` cases (``gs-1`` ...); the first ``open_handoffs`` get an open
    ``callback`` handoff with a deadline, the first ``pending_outbox`` a pending
    ``handoff.request`` in the outbox.  The store must be migrated and empty."""
    began = time.monotonic()
    now = time.time()
    body = _body(size)
    handoffs: list[tuple[str, str]] = []
    conn = sqlite3.connect(str(database), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-262144")
        step = min(1.0, 6 * 86400 / max(1, cases))  # seconds between cases
        for chunk in _batches(1, cases):
            conn.execute("BEGIN")
            c_rows, m_rows, d_rows, t_rows, h_rows, s_rows, o_rows = [], [], [], [], [], [], []
            for i in chunk:
                key = f"ticket=gs-{i}@{DOMAIN}"
                who = f"p{i}@example.org"
                # Older first, all within the dedupe window: a store masd
                # would not start purging (that is housekeeping's cost, not
                # a message's).  message_ref as masd makes it (time first).
                at = now - (cases - i) * step
                ref = new_message_ref(at)
                mid = f"<fill.{i}@example.org>"
                raw = (
                    f"From: <{who}>\r\nTo: <ticket@{DOMAIN}>\r\nDate: Sun, 29 Nov 2026 20:00:00"
                    f" +0000\r\nMessage-Id: {mid}\r\nSubject: case {i}\r\n\r\n{body}"
                ).encode()
                sha = hashlib.sha256(raw).hexdigest()
                event: dict[str, object] = {
                    "attachments": [],
                    "auth": {"authserv_id": None, "dmarc": "absent"},
                    "automated": {"is": False, "reason": None},
                    "date": "Sun, 29 Nov 2026 20:00:00 +0000",
                    "from": {"address": who, "name": None},
                    "in_reply_to": None,
                    "mail_from": who,
                    "message_id": mid,
                    "message_ref": ref,
                    "rcpt_to": f"ticket@{DOMAIN}",
                    "received_at": "2026-11-29T20:00:00.000Z",
                    "references": [],
                    "subject": f"case {i}",
                    "text": body.replace("\r\n", "\n"),
                }
                c_rows.append((key, key, DOMAIN, "ticket", f"gs-{i}", "master", who, at, 2))
                m_rows.append(
                    (
                        ref,
                        key,
                        f"ticket@{DOMAIN}",
                        who,
                        mid,
                        who,
                        sha,
                        len(raw),
                        raw,
                        _dumps(event),
                        at,
                    )
                )
                dedupe = hashlib.sha256(f"{mid}\0ticket@{DOMAIN}\0{sha}".encode()).hexdigest()
                d_rows.append((dedupe, ref, at))
                t_rows.append((key, 1, "mail.in", at, _dumps({"from": who, "message_ref": ref})))
                t_rows.append(
                    (
                        key,
                        2,
                        "mail.refused",
                        at,
                        _dumps({"purpose": "acknowledge", "reason": "unauthenticated-sender"}),
                    )
                )
                if i <= open_handoffs or i <= pending_outbox:
                    hid = secrets.token_hex(16)
                    handoffs.append((key, hid))
                    h_rows.append(
                        (
                            hid,
                            key,
                            "callback",
                            MODE_PEER,
                            "requested",
                            at,
                            now + 7200 + i % 3600,
                            _dumps({"subject": f"case {i}"}),
                        )
                    )
                    s_rows.append((hid, 1, "requested", "email", at))
                    if i <= pending_outbox:
                        request = {
                            "mas_modes_version": "0.1",
                            "type": "handoff.request",
                            "id": secrets.token_hex(16),
                            "case": {"address": key, "key": key},
                            "handoff_id": hid,
                            "mode": "callback",
                            "details": {"subject": f"case {i}"},
                            "status_url": status_url,
                            "participant": {"address": who},
                        }
                        o_rows.append(
                            (
                                f"{key}|{MODE_PEER}",
                                MODE_PEER,
                                key,
                                sink_url,
                                _dumps(request),
                                now,
                                now,
                                now + 3 * 86400,
                            )
                        )
            conn.executemany(
                "INSERT INTO cases (key, address, domain, type, id, role, participant, "
                "created_at, thread_seq) VALUES (?,?,?,?,?,?,?,?,?)",
                c_rows,
            )
            conn.executemany(
                "INSERT INTO messages (message_ref, case_key, rcpt_to, mail_from, message_id, "
                "from_address, sha256, size, raw, event, received_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                m_rows,
            )
            conn.executemany(
                "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?,?,?)", d_rows
            )
            conn.executemany(
                "INSERT INTO thread (case_key, seq, kind, at, data) VALUES (?,?,?,?,?)", t_rows
            )
            conn.executemany(
                "INSERT INTO handoffs (handoff_id, case_key, mode, peer, status, requested_at, "
                "deadline_at, forwarded, details) VALUES (?,?,?,?,?,?,?,1,?)",
                h_rows,
            )
            conn.executemany(
                "INSERT INTO statuses (handoff_id, n, status, source, at) VALUES (?,?,?,?,?)",
                s_rows,
            )
            conn.executemany(
                "INSERT INTO outbox (kind, queue, peer, case_key, url, payload, created_at, "
                "next_attempt_at, deliver_until) VALUES ('contract',?,?,?,?,?,?,?,?)",
                o_rows,
            )
            conn.execute("COMMIT")
        conn.execute(
            "INSERT INTO id_counters (domain, type, next_n) VALUES (?, 'ticket', ?) "
            "ON CONFLICT (domain, type) DO UPDATE SET next_n = excluded.next_n",
            (DOMAIN, cases + 1),
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return Filled(cases, handoffs, pending_outbox, time.monotonic() - began)
