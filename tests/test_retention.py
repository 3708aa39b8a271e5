"""Cases past their type's ``retain`` go with everything they hold; the send log after 24 hours
(docs/protocol.md §18, docs/operations.md).

A real store and the real delivery path, at times an injected clock gives.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.http import Running, deliver, serving

from masd.service import expired, purge, retire
from masd.store.sql import Tx, value

DAY = 86400.0


def _retain_30d(text: str) -> str:
    return text.replace(
        '[domains."help.example".types.ticket]\n',
        '[domains."help.example".types.ticket]\nretain = "30d"\n',
        1,
    )


async def _count(run: Running, table: str, key: str) -> int:
    column = "key" if table == "cases" else "case_key"
    return int(
        await run.store.read(
            lambda tx: value(tx, f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (key,))
        )
    )


async def _rows(run: Running, key: str) -> dict[str, int]:
    return {t: await _count(run, t, key) for t in ("cases", "messages", "thread", "handoffs")}


def _close_handoffs(tx: Tx, key: str, at: float) -> None:
    db: Any = tx
    db.execute(
        "UPDATE handoffs SET status = 'completed', closed_at = ? WHERE case_key = ?", (at, key)
    )


def test_cases_past_retain_go_with_their_rows_in_bounded_batches(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path, adjust=_retain_30d) as run:
            day0 = run.clock.now() - 40 * DAY

            async def mail(rcpt: str, at: float, **kw: Any) -> str:
                return (await deliver(run.store, run.rt, rcpt, at, **kw)).case_key

            old = [await mail("ticket@help.example", day0 + i) for i in range(3)]
            handed = await mail("ticket!callback@help.example", day0)  # its handoff stays open
            closed = await mail("ticket!callback@help.example", day0)
            await run.store.write(lambda tx: _close_handoffs(tx, closed, day0 + 1))
            replied = await mail("ticket@help.example", day0)
            await mail(replied, day0 + 35 * DAY, subject="Re: still there")  # a recent entry
            young = await mail("ticket@help.example", day0 + 20 * DAY)
            now = day0 + 40 * DAY
            kept = (handed, replied, young)
            before = {k: await _rows(run, k) for k in (*old, closed, *kept)}
            assert all(r["cases"] == 1 and r["thread"] >= 1 for r in before.values())
            assert before[closed]["handoffs"] == 1

            auth = {"Authorization": "Bearer admin-secret-7f3a91c2-5be04d8e1a96c3f0"}
            feed = await run.client.get("/mas/v0.1/events", params={"limit": 1000}, headers=auth)
            events = feed.json()["events"]
            inside = next(e["cursor"] for e in events if e["case"]["key"] == old[1])

            # A read finds at most a batch; the write removes what is still expired.
            first = await run.store.read(lambda tx: expired(run.rt, tx, now, limit=2))
            assert len(first) == 2
            removed = await run.store.write(lambda tx: retire(tx, first))
            assert removed["cases"] == 2
            rest = await run.store.read(lambda tx: expired(run.rt, tx, now))
            assert sorted(k for k, _ in rest) == sorted([old[2], closed])
            removed = await run.store.write(lambda tx: retire(tx, rest))
            assert removed["cases"] == 2
            assert removed["handoffs"] == 1
            assert removed["statuses"] >= 1
            assert await run.store.read(lambda tx: expired(run.rt, tx, now)) == []

            for key in (*old, closed):
                assert set((await _rows(run, key)).values()) == {0}
            for key in kept:
                assert await _rows(run, key) == before[key], key
            # Nothing dangles: every status, outbox row and kept send still has its case.
            orphans = await run.store.read(
                lambda tx: value(
                    tx,
                    "SELECT (SELECT COUNT(*) FROM statuses s LEFT JOIN handoffs h "
                    "ON h.handoff_id = s.handoff_id WHERE h.handoff_id IS NULL) + "
                    "(SELECT COUNT(*) FROM outbox o LEFT JOIN cases c ON c.key = o.case_key "
                    "WHERE o.case_key IS NOT NULL AND c.key IS NULL)",
                )
            )
            assert orphans == 0
            # The feed: the removed cases' events are gone, a cursor among them still serves.
            after = await run.client.get(
                "/mas/v0.1/events", params={"after": inside, "limit": 1000}, headers=auth
            )
            assert after.status_code == 200
            gone_keys = {*old, closed}
            later = [e for e in events if int(e["cursor"][1:]) > int(inside[1:])]
            expected = [e["cursor"] for e in later if e["case"]["key"] not in gone_keys]
            assert [e["cursor"] for e in after.json()["events"]] == expected
            # Over HTTP the removed case is unknown.
            gone = await run.client.get(
                f"/mas/v0.1/cases/{old[0]}",
                headers={"Authorization": "Bearer admin-secret-7f3a91c2-5be04d8e1a96c3f0"},
            )
            assert (gone.status_code, gone.json()["error"]) == (404, "unknown-case")

    asyncio.run(main())


def test_a_case_holding_the_latest_entry_is_kept(tmp_path: Path) -> None:
    """The feed's positions are never given twice: the newest entry stays."""

    async def main() -> None:
        async with serving(tmp_path, adjust=_retain_30d) as run:
            day0 = run.clock.now() - 40 * DAY
            await deliver(run.store, run.rt, "ticket@help.example", day0)
            last = (await deliver(run.store, run.rt, "ticket@help.example", day0 + 1)).case_key
            found = await run.store.read(lambda tx: expired(run.rt, tx, day0 + 40 * DAY))
            keys = [k for k, _ in found]
            assert keys != []
            assert last not in keys

    asyncio.run(main())


def test_the_send_log_is_kept_24_hours(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            now = run.clock.now()
            await deliver(run.store, run.rt, "ticket@help.example", now - 2 * DAY)
            await deliver(run.store, run.rt, "ticket@help.example", now - DAY + 60)
            sends = "SELECT COUNT(*) FROM send_log"
            assert await run.store.read(lambda tx: value(tx, sends)) == 2
            removed = await run.store.write(lambda tx: purge(tx, now))
            assert removed["send_log"] == 1
            assert await run.store.read(lambda tx: value(tx, sends)) == 1

    asyncio.run(main())
