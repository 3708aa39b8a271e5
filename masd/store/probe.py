"""What ``masd doctor`` reads from the store: whether it can be written, recent messages.

The store is opened on its own connection, never created or migrated here
(a missing file is a finding, not something to fix), and every check is a
rolled-back transaction: the doctor changes nothing.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

from masd.core.errors import MasdError

#: How long a check waits for masd's writer to let go of the store.
BUSY_TIMEOUT_MS: Final = 5000
#: The header part read of each message: enough for any header block masd's
#: trust rules read (its Authentication-Results sit at the top).
HEADER_OCTETS: Final = 65536


class DoctorStoreError(MasdError):
    """The store cannot be opened, read or written (the message says which and why)."""

    code = "store"


@dataclass(frozen=True)
class RecentMessage:
    """One recorded message, as the trust check needs it."""

    message_ref: str
    received_at: float
    dmarc: str | None  # the verdict masd recorded (auth.dmarc)
    authserv_id: str | None  # the trusted A-R it came from, or None
    head: bytes  # the first HEADER_OCTETS of the raw message


def _connect(database: Path) -> sqlite3.Connection:
    if not database.exists():
        raise DoctorStoreError(f"{database} does not exist (masd creates it when it starts)")
    try:
        # The path quoted: a "#" or "?" in it would end the file name of the URI.
        uri = f"file:{quote(str(database.absolute()))}?mode=rw"
        db = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot open {database}: {exc}") from exc
    db.isolation_level = None  # transactions are begun explicitly below
    return db


def check_writable(database: Path) -> None:
    """Take the store's write lock and give it back (``BEGIN IMMEDIATE``, ``ROLLBACK``)."""
    db = _connect(database)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot write {database}: {exc}") from exc
    finally:
        db.close()


def recent_messages(database: Path, limit: int) -> list[RecentMessage]:
    """The ``limit`` most recently received messages, newest first."""
    db = _connect(database)
    try:
        rows = db.execute(
            "SELECT message_ref, received_at, json_extract(event, '$.auth.dmarc'), "
            "json_extract(event, '$.auth.authserv_id'), substr(raw, 1, ?) "
            "FROM messages ORDER BY received_at DESC LIMIT ?",
            (HEADER_OCTETS, limit),
        ).fetchall()
    except sqlite3.Error as exc:
        raise DoctorStoreError(f"cannot read the messages of {database}: {exc}") from exc
    finally:
        db.close()
    return [
        RecentMessage(str(ref), float(at), dmarc, sid, bytes(head))
        for ref, at, dmarc, sid, head in rows
    ]
