"""``masd intake list`` and ``GET /mas/v0.1/intakes`` list the same intakes by default,
pending and assigned alike; ``--state`` (``?state=``) narrows both alike.  Over the real HTTP
edge and delivery path, the command on the same SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from support.http import ADMIN, CRM, Running, deliver, serving

from masd.cli import main

INTAKES = "/mas/v0.1/intakes"


async def _assign_one(r: Running) -> None:
    """Two intakes by mail; the master assigns the first."""
    for n in range(2):
        await deliver(r.store, r.rt, "case@help.example", r.clock.now(), subject=f"Intake {n}")
    rows = await r.store.read(
        lambda db: db.execute("SELECT intake_ref FROM intakes ORDER BY rowid").fetchall()
    )
    assign = {
        "mas_modes_version": "0.1",
        "type": "case.assign",
        "id": "assign-1",
        "intake_ref": rows[0][0],
        "resource_id": "c-1",
    }
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {CRM}"}
    answer = await r.client.post("/mas/v0.1/messages", json=assign, headers=headers)
    assert answer.status_code == 200, answer.text


def _listed(config: Path, *args: str) -> dict[str, Any]:
    done = CliRunner().invoke(main, ["intake", "list", "--config", str(config), "--json", *args])
    assert done.exit_code == 0, done.output
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_the_command_and_the_route_list_the_same_intakes(tmp_path: Path) -> None:
    async def main_() -> None:
        async with serving(tmp_path) as r:
            await _assign_one(r)
            config = tmp_path / "masd.toml"
            auth = {"Authorization": f"Bearer {ADMIN}"}
            for query, args in (({}, ()), ({"state": "pending"}, ("--state", "pending"))):
                served = await r.client.get(INTAKES, params=query, headers=auth)
                assert served.status_code == 200, served.text
                listed = await asyncio.to_thread(_listed, config, *args)
                assert listed == served.json(), query
            both = await asyncio.to_thread(_listed, config)
            assert [bool(i["case"]) for i in both["intakes"]] == [True, False]
            command = ["intake", "list", "--config", str(config)]
            shown = await asyncio.to_thread(CliRunner().invoke, main, command)
            assert shown.exit_code == 0, shown.output
            assert [line.split()[1] for line in shown.stdout.splitlines()[1:]] == [
                "assigned",
                "pending",
            ]

    asyncio.run(main_())
