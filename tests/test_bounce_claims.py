"""A bounce report only claims what failed (docs/protocol.md §22): a DSN sent to the bounce
address of alice's acknowledgement that names victim@example.net is recorded with recipient
alice (the address the tag names), the claim kept as ``claimed_recipient``, and only alice is
suppressed: victim's next mail is still acknowledged.  Through the real delivery path on a
real SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from support.bounces import deliver_raw, postfix_dsn, sent_mails
from support.http import Running, deliver, serving

from masd.cli.text import format_entry
from masd.console.timeline import summary

ALICE = "alice@example.com"
VICTIM = "victim@example.net"


async def _rows(r: Running, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = await r.store.read(lambda db: db.execute(sql, args).fetchall())
    return rows


async def _entries(r: Running, key: str, kind: str) -> list[dict[str, Any]]:
    rows = await _rows(
        r, "SELECT seq, data FROM thread WHERE case_key = ? AND kind = ? ORDER BY seq", key, kind
    )
    return [{"seq": seq, "kind": kind, **json.loads(data)} for seq, data in rows]


def test_a_report_naming_another_address_suppresses_only_the_tags(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as r:
            got = await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender=ALICE)
            (ack,) = await sent_mails(r.store)
            assert ack.rcpt_to == ALICE
            forged = postfix_dsn(ack.mail_from, VICTIM)
            await deliver_raw(r.store, r.rt, ack.mail_from, forged, r.clock.now())

            (bounced,) = await _entries(r, got.case_key, "mail.bounced")
            (out,) = await _entries(r, got.case_key, "mail.out")
            assert bounced["recipient"] == ALICE, bounced
            assert bounced["claimed_recipient"] == VICTIM
            assert bounced["mail_seq"] == out["seq"]
            assert (bounced["status"], bounced["permanent"]) == ("5.1.1", True)
            assert await _rows(r, "SELECT address FROM suppressions") == [(ALICE,)]
            assert await _rows(r, "SELECT recipient FROM bounces") == [(ALICE,)]
            # The operator sees both, on the command line and in the console.
            assert f"to {ALICE}" in format_entry(bounced)
            assert f"claimed_recipient={VICTIM}" in format_entry(bounced)
            assert f"the report names {VICTIM}" in summary(bounced)

            # The victim is not suppressed: its mail is acknowledged as before.
            await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender=VICTIM)
            assert [m.rcpt_to for m in await sent_mails(r.store)] == [ALICE, VICTIM]
            # Alice, who really failed, is: her next acknowledgement is refused.
            again = await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender=ALICE)
            (refused,) = await _entries(r, again.case_key, "mail.refused")
            assert (refused["reason"], refused["to"]) == ("suppressed", ALICE)

    asyncio.run(main())


def test_a_report_naming_the_tags_own_address_has_no_claim(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as r:
            got = await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), sender=ALICE)
            (ack,) = await sent_mails(r.store)
            dsn = postfix_dsn(ack.mail_from, ALICE.upper())
            await deliver_raw(r.store, r.rt, ack.mail_from, dsn, r.clock.now())
            (bounced,) = await _entries(r, got.case_key, "mail.bounced")
            assert bounced["recipient"] == ALICE
            assert "claimed_recipient" not in bounced

    asyncio.run(main())
