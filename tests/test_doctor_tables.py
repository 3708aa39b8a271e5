"""``masd doctor`` says how much each table of the store holds (docs/operations.md §8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.http import deliver, serving

from masd.ops.doctor import check_tables


def test_doctor_counts_the_rows_and_bytes_of_each_table(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as run:
            for _ in range(3):
                await deliver(run.store, run.rt, "ticket@help.example", run.clock.now())
            [finding] = check_tables(run.config)
            assert finding.ok
            assert finding.what == "store tables"
            parts = dict(p.split(" ", 1) for p in finding.why.split(", "))
            assert parts["cases"].startswith("3 rows")
            assert parts["messages"].startswith("3 rows")
            assert parts["thread"].startswith("6 rows")
            assert parts["send_log"].startswith("3 rows")
            # Bytes too, for a store this small (pages walked with dbstat where SQLite has it).
            assert "KiB)" in parts["messages"] or "B)" in parts["messages"]

    asyncio.run(main())
