"""The read side's view of unfinished work, on a real store fed by the real service."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from support.http import deliver, write_config

from masd.config import load_config
from masd.read.case_views import open_work
from masd.service import Runtime, outbox_done
from masd.store import Store

NOW = 1_790_000_000.0


def test_open_work_lists_open_handoffs_and_undelivered_rows(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    rt = Runtime(config, new_id=lambda: secrets.token_hex(16))

    async def main() -> None:
        with Store.open(config.server.database) as store:
            assert await store.read(open_work) == {"handoffs": [], "outbox": []}
            got = await deliver(store, rt, "ticket!callback@help.example", NOW)
            work = await store.read(open_work)
            [handoff] = work["handoffs"]
            assert handoff["case_key"] == got.case_key
            assert (handoff["role"], handoff["mode"], handoff["status"]) == (
                "master",
                "callback",
                "requested",
            )
            # The handoff.request to the mode, and the acknowledgement mail.
            kinds = sorted((row["kind"], row["case_key"]) for row in work["outbox"])
            assert kinds == [("contract", got.case_key), ("mail", got.case_key)]
            assert all(row["attempts"] == 0 for row in work["outbox"])
            for row in work["outbox"]:
                await store.write(lambda tx, oid=row["id"]: outbox_done(tx, oid, NOW))
            assert (await store.read(open_work))["outbox"] == []
            assert len((await store.read(open_work))["handoffs"]) == 1

    asyncio.run(main())
