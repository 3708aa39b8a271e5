"""Bounces: the store's bounce secret, the bounces received, suppressed addresses.

- ``bounce_key``: one row, the secret under which bounce tags are made
  (:mod:`masd.core.bounce`); written the first time a mail needs one, never
  changed after (a new secret would make every bounce on the way invalid).
- ``bounces``: one row per bounce recorded, by the message that carried it;
  a permanent one marks the outbound mail (its outbox id) ``bounced``.
- ``suppressions``: a permanently failed recipient (lower case) and until
  when masd's own mails to it are refused.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from masd.store.sql import Tx, dialect, one, rows, run, send, value

__all__ = [
    "Bounce",
    "Suppression",
    "bounce_of",
    "bounces_of",
    "drop_suppression",
    "key",
    "key_or_none",
    "mail_out",
    "record",
    "suppress",
    "suppressed_until",
    "suppressions",
]


def key_or_none(tx: Tx) -> bytes | None:
    """The bounce secret, or None while no mail has needed one.

    Once made it never changes: a store that keeps a cache for its jobs
    (``masd_cache``, PostgreSQL's, where a read is a round trip) reads it once."""
    cache: dict[str, object] | None = getattr(tx, "masd_cache", None)
    if cache is not None and isinstance(kept := cache.get("bounce_key"), bytes):
        return kept
    found = value(tx, "SELECT secret FROM bounce_key WHERE id = 1")
    if found is None:
        return None
    secret = bytes.fromhex(str(found))
    if cache is not None:
        cache["bounce_key"] = secret
    return secret


def key(tx: Tx, now: float) -> bytes:
    """The bounce secret, made (256 random bits) the first time it is asked for."""
    found = key_or_none(tx)
    if found is not None:
        return found
    send(
        tx,
        "INSERT INTO bounce_key (id, secret, created_at) VALUES (1, ?, ?) "
        "ON CONFLICT (id) DO NOTHING",
        (secrets.token_hex(32), now),
    )
    made = value(tx, "SELECT secret FROM bounce_key WHERE id = 1")  # not kept: may roll back
    if made is None:  # pragma: no cover - the insert above or another host's wrote it
        raise RuntimeError("bounce_key has no row after its insert")
    return bytes.fromhex(str(made))


@dataclass(frozen=True)
class Bounce:
    """A bounce as recorded."""

    message_ref: str
    outbox_id: int
    case_key: str
    recipient: str
    status: str
    diagnostic: str | None
    remote_mta: str | None
    permanent: bool
    at: float


_COLUMNS = (
    "message_ref, outbox_id, case_key, recipient, status, diagnostic, remote_mta, permanent, at"
)


def _bounce(row: dict[str, Any]) -> Bounce:
    return Bounce(
        str(row["message_ref"]),
        int(row["outbox_id"]),
        str(row["case_key"]),
        str(row["recipient"]),
        str(row["status"]),
        row["diagnostic"],
        row["remote_mta"],
        bool(row["permanent"]),
        float(row["at"]),
    )


def record(tx: Tx, b: Bounce) -> None:
    """Record bounce ``b``."""
    send(
        tx,
        f"INSERT INTO bounces ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (
            b.message_ref,
            b.outbox_id,
            b.case_key,
            b.recipient,
            b.status,
            b.diagnostic,
            b.remote_mta,
            int(b.permanent),
            b.at,
        ),
    )


def bounce_of(tx: Tx, outbox_id: int) -> Bounce | None:
    """The first permanent bounce (by message_ref, so by arrival) of mail ``outbox_id``."""
    found = one(
        tx,
        f"SELECT {_COLUMNS} FROM bounces WHERE outbox_id = ? AND permanent = 1 "  # noqa: S608
        "ORDER BY message_ref LIMIT 1",
        (outbox_id,),
    )
    return None if found is None else _bounce(found)


def bounces_of(tx: Tx, outbox_ids: list[int]) -> dict[int, Bounce]:
    """:func:`bounce_of` for several rows at once (the read side's thread pages)."""
    if not outbox_ids:
        return {}
    marks = ", ".join("?" for _ in outbox_ids)
    found = rows(
        tx,
        f"SELECT {_COLUMNS} FROM bounces WHERE permanent = 1 "  # noqa: S608 - marks only
        f"AND outbox_id IN ({marks}) ORDER BY at DESC, message_ref DESC",
        outbox_ids,
    )
    return {b.outbox_id: b for b in map(_bounce, found)}


@dataclass(frozen=True)
class Suppression:
    address: str
    until: float
    status: str
    case_key: str
    message_ref: str
    at: float


def suppress(tx: Tx, s: Suppression) -> None:
    """Suppress ``s.address`` (lower case) until ``s.until``; a later bounce extends it."""
    send(
        tx,
        "INSERT INTO suppressions (address, until, status, case_key, message_ref, at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (address) DO UPDATE SET "
        "until = excluded.until, status = excluded.status, case_key = excluded.case_key, "
        "message_ref = excluded.message_ref, at = excluded.at",
        (s.address, s.until, s.status, s.case_key, s.message_ref, s.at),
    )


def suppressed_until(tx: Tx, address: str) -> float | None:
    """Until when ``address`` (lower case) is suppressed, or None."""
    found = value(tx, "SELECT until FROM suppressions WHERE address = ?", (address,))
    return None if found is None else float(found)


def suppressions(tx: Tx, now: float) -> list[Suppression]:
    """Every suppression still in force at ``now``, soonest end first."""
    found = rows(
        tx,
        "SELECT address, until, status, case_key, message_ref, at FROM suppressions "
        "WHERE until > ? ORDER BY until, address",
        (now,),
    )
    return [
        Suppression(
            str(r["address"]),
            float(r["until"]),
            str(r["status"]),
            str(r["case_key"]),
            str(r["message_ref"]),
            float(r["at"]),
        )
        for r in found
    ]


def drop_suppression(tx: Tx, address: str) -> bool:
    """Lift the suppression of ``address`` (lower case); whether there was one."""
    return run(tx, "DELETE FROM suppressions WHERE address = ?", (address,)) > 0


def mail_out(tx: Tx, case_key: str, outbox_id: int) -> tuple[int, str] | None:
    """The ``mail.out`` entry of case ``case_key`` that queued row ``outbox_id``: (seq, to)."""
    d = dialect(tx)
    found = one(
        tx,
        f"SELECT seq, {d.json_get('data', 'to')} AS recipient FROM thread "  # noqa: S608
        f"WHERE case_key = ? AND kind = 'mail.out' AND {d.json_int('data', 'outbox_id')} = ? "
        "ORDER BY seq LIMIT 1",
        (case_key, outbox_id),
    )
    return None if found is None else (int(found["seq"]), str(found["recipient"]))
