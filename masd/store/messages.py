"""Recorded mails, their delivery dedupe (docs/protocol.md §3) and slave-role intakes
(docs/protocol.md §13.1)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Final, cast

from masd.core.event import GatewayEvent
from masd.core.reply import reply_text
from masd.core.slave import IntakeView
from masd.store.backend import SQLITE, Dialect, Raced
from masd.store.sql import Tx, dialect, dumps, one, rerun, send, tuples, value

#: A mail at least this large is written with SQLite's blob I/O (:func:`_insert_sqlite`).
BLOB_IO_BYTES: Final = 1 << 20
_INSERT: Final = (
    "INSERT INTO messages (message_ref, case_key, intake_ref, rcpt_to, mail_from, message_id, "
    "from_address, sha256, size, event, received_at, raw) VALUES (?,?,?,?,?,?,?,?,?,?,?,{})"
)
_INSERT_BOUND: Final = _INSERT.format("?")
_INSERT_ZEROBLOB: Final = _INSERT.format("zeroblob(?)")


def stored_event(ev: GatewayEvent) -> str:
    """``ev`` as its ``messages`` row keeps it: its ``reply_text`` left empty where it is
    the whole ``text`` (the sender's own words are all of it, as in most mail that opens
    a case), so the text is not kept twice.  An event never has an empty ``reply_text``
    beside a text (masd.core.event), so :func:`event_of` tells the two apart."""
    data = ev.to_json()
    if data["text"] and data["reply_text"] == data["text"]:
        data["reply_text"] = ""
    return dumps(data)


def event_of(stored: str | bytes) -> dict[str, Any]:
    """The event a ``messages`` row keeps (:func:`stored_event`), as masd sends it, to every
    reader: the read API and console, a master's ``case.message``, a reply's sender.  One
    recorded before ``reply_text`` existed gets it from its text (the plain-text rules of
    :mod:`masd.core.reply`)."""
    data: dict[str, Any] = json.loads(stored)
    text = data.get("text")
    if "reply_text" not in data:
        if isinstance(text, str):
            data["reply_text"] = reply_text(text)
    elif data["reply_text"] == "" and text:
        data["reply_text"] = text
    return data


def record(
    tx: Tx,
    ev: GatewayEvent,
    raw: bytes,
    sha256: str,
    now: float,
    *,
    dedupe: str,
    case_key: str | None,
    intake_ref: str | None = None,
    seen_before: float | None = None,
) -> None:
    """Record one recipient's copy of a mail, and its dedupe key.

    The key is unique: a row under it is taken over only when older than
    ``seen_before`` (the dedupe window; None: any age).  Where another host
    recorded the same copy meanwhile (its commit not visible to this job), nothing
    is taken over and the job is run again (:class:`~masd.store.backend.Raced`),
    to find that copy recorded: a mail delivered to two hosts at once is recorded
    once, and both answer for it."""
    columns = [
        ev.message_ref,
        case_key,
        intake_ref,
        ev.rcpt_to,
        ev.mail_from,
        ev.message_id,
        ev.from_address,
        sha256,
        len(raw),
        stored_event(ev),
        now,
        raw,
    ]
    if dialect(tx) is SQLITE and len(raw) >= BLOB_IO_BYTES:
        _insert_sqlite(tx, columns, raw)
    else:
        send(tx, _INSERT_BOUND, columns)
    params = (dedupe, ev.message_ref, now, now if seen_before is None else seen_before)
    if dialect(tx).lock_rows:  # one statement whose result is not read (pipeline mode)
        send(tx, _TAKE_OR_RACE, params)
        return
    taken = tuples(tx, _TAKE, params)
    if not taken:
        raise Raced(f"the mail {ev.message_ref} was recorded by another writer first")


_TAKE = (
    "INSERT INTO deliveries (dedupe, message_ref, at) VALUES (?, ?, ?) "
    "ON CONFLICT (dedupe) DO UPDATE SET message_ref = excluded.message_ref, at = excluded.at "
    "WHERE deliveries.at <= ? RETURNING dedupe"
)
#: Where several hosts write: the key taken, or the statement fails as a race
#: (:class:`~masd.store.backend.Raced`'s way, with no result to read back).
_TAKE_OR_RACE = (
    f"WITH t AS ({_TAKE}) SELECT masd_raced('the mail was recorded by another writer first') "  # noqa: S608
    "WHERE NOT EXISTS (SELECT 1 FROM t)"
)


def _insert_sqlite(tx: Tx, columns: list[Any], raw: bytes) -> None:
    """The row, with ``raw`` written into its pages through SQLite's blob I/O.

    A bound value stays with its prepared statement until the statement is
    next used: a large mail's copy would be held after it was recorded.  A
    ``zeroblob`` of its size, then written in place, leaves none behind; its
    pages are written twice, so a small mail is bound as any value.  ``raw``
    ends the row (migration 3), so the record SQLite builds carries the
    zeroblob as its size alone, not as that many zero bytes.
    """
    columns[-1] = len(raw)
    conn: sqlite3.Connection = cast(Any, tx).conn
    rowid = conn.execute(_INSERT_ZEROBLOB, columns).lastrowid
    assert rowid is not None
    with conn.blobopen("messages", "raw", rowid) as blob:
        blob.write(raw)


@dataclass(frozen=True)
class Seen:
    """A mail recorded before under the same dedupe key."""

    message_ref: str
    case_key: str  # "" for a slave-role intake not assigned yet
    at: float


def looks_first(tx: Tx) -> bool:
    """Whether a write job looks for its copy's dedupe key (:func:`seen`) before it
    records the copy.

    With one writer (SQLite) the look costs nothing.  Where several hosts write, a
    look is a round trip, and :func:`record`'s take of the key finds a repeat by
    itself: the statement fails, the job is rolled back and run again
    (:class:`~masd.store.backend.Raced`), and only that second run looks, to answer
    as the duplicate.  A repeat costs a run; every other mail, a round trip less."""
    return not dialect(tx).lock_rows or rerun(tx)


def seen(tx: Tx, dedupe: str, since: float) -> Seen | None:
    """The mail recorded under ``dedupe`` after ``since``, if any."""
    found = one(tx, "SELECT message_ref, at FROM deliveries WHERE dedupe = ?", (dedupe,))
    if found is None or not found["at"] > since:
        return None
    m = one(tx, "SELECT case_key FROM messages WHERE message_ref = ?", (found["message_ref"],))
    return Seen(found["message_ref"], (m or {}).get("case_key") or "", found["at"])


@dataclass(frozen=True)
class Sender:
    """Who sent a recorded mail, and the event masd recorded for it."""

    message_ref: str
    from_address: str
    event: dict[str, Any]


def _sender(row: dict[str, Any] | None) -> Sender | None:
    if row is None:
        return None
    return Sender(row["message_ref"], row["from_address"] or "", event_of(row["event"]))


def on_case(tx: Tx, case_key: str, message_ref: str) -> Sender | None:
    """The mail ``message_ref`` if it was recorded on case ``case_key``."""
    return _sender(
        one(
            tx,
            "SELECT message_ref, from_address, event FROM messages "
            "WHERE message_ref = ? AND case_key = ?",
            (message_ref, case_key),
        )
    )


def latest_from(tx: Tx, case_key: str, address: str) -> Sender | None:
    """The latest mail from ``address`` (any case of letters) on case ``case_key``.

    Two mails received in the same instant (a clock standing still) are told apart
    by the order they were recorded in: SQLite's ``rowid``; elsewhere, the place of
    each one's ``mail.in`` entry in the case's thread."""
    return _sender(
        one(
            tx,
            "SELECT message_ref, from_address, event FROM messages "  # noqa: S608 - dialect words only
            "WHERE case_key = ? AND lower(from_address) = lower(?) "
            f"ORDER BY received_at DESC, {_recorded_order(dialect(tx))} DESC LIMIT 1",
            (case_key, address),
        )
    )


def _recorded_order(d: Dialect) -> str:
    if d.name == "sqlite":
        return "rowid"
    return (
        "COALESCE((SELECT max(t.seq) FROM thread t WHERE t.case_key = messages.case_key "  # noqa: S608
        f"AND t.kind = 'mail.in' AND {d.json_get('t.data', 'message_ref')} = "
        "messages.message_ref), 0) DESC, message_ref"
    )


def move_to_case(tx: Tx, message_ref: str, case_key: str) -> None:
    send(tx, "UPDATE messages SET case_key = ? WHERE message_ref = ?", (case_key, message_ref))


@dataclass(frozen=True)
class Intake:
    """A slave-role intake (docs/protocol.md §13.1), and who sent its mail to whom."""

    view: IntakeView
    mail_from: str
    rcpt_to: str


def open_intake(
    tx: Tx, intake_ref: str, domain: str, type_: str, message_ref: str, mode: str | None, now: float
) -> None:
    send(
        tx,
        "INSERT INTO intakes (intake_ref, domain, type, message_ref, requested_mode, "
        "created_at) VALUES (?,?,?,?,?,?)",
        (intake_ref, domain, type_, message_ref, mode, now),
    )


def intake(tx: Tx, intake_ref: str) -> Intake | None:
    """The intake ``intake_ref`` with its mail, in one statement."""
    row = one(
        tx,
        "SELECT i.intake_ref, i.domain, i.type, i.requested_mode, i.case_key, m.message_ref, "
        "m.mail_from, m.rcpt_to, m.from_address, m.event FROM intakes i "
        "JOIN messages m ON m.message_ref = i.message_ref WHERE i.intake_ref = ?",
        (intake_ref,),
    )
    if row is None:
        return None
    view = IntakeView(
        intake_ref=row["intake_ref"],
        domain=row["domain"],
        type=row["type"],
        requested_mode=row["requested_mode"],
        case_key=row["case_key"],
        message_ref=row["message_ref"],
        from_address=row["from_address"],
        event=event_of(row["event"]),
    )
    return Intake(view, row["mail_from"], row["rcpt_to"])


def raw(tx: Tx, message_ref: str) -> bytes:
    """The bytes of recorded mail ``message_ref``."""
    return bytes(value(tx, "SELECT raw FROM messages WHERE message_ref = ?", (message_ref,)))


def assign_intake(tx: Tx, intake_ref: str, case_key: str, now: float) -> None:
    send(
        tx,
        "UPDATE intakes SET case_key = ?, assigned_at = ? WHERE intake_ref = ?",
        (case_key, now, intake_ref),
    )
