"""``masd suppress``: the addresses masd's own mails are not sent to (docs/protocol.md §22).

A recipient whose mail bounced for good is suppressed for ``server.suppress_for``:
``list`` shows them, ``drop ADDR`` lifts one (the address works again, say).  Both open
the store beside a running masd (SQLite in WAL mode, or the shared PostgreSQL).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from masd.cli.common import CONFIG, load

if TYPE_CHECKING:
    from masd.store.db import Store
    from masd.store.pg_backend import PgStore


def _store(config_file: Path) -> Store | PgStore:
    from masd.core.errors import MasdError
    from masd.store import open_store

    config = load(config_file)
    try:
        return open_store(config.server.database, migrate=False)
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None


@click.group()
def suppress() -> None:
    """Addresses whose mail bounced for good: masd's own mails to them are refused."""


@suppress.command("list")
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="One JSON object per address.")
def suppress_list(config_file: Path, as_json: bool) -> None:
    """Each suppressed address, until when, the status that suppressed it and its case."""
    from masd.core.times import rfc3339
    from masd.store import bounces

    now = time.time()
    with _store(config_file) as store:
        found = store.read_sync(lambda db: bounces.suppressions(db, now))
    for s in found:
        doc = {
            "address": s.address,
            "until": rfc3339(s.until),
            "status": s.status,
            "case": s.case_key,
            "message_ref": s.message_ref,
            "since": rfc3339(s.at),
        }
        if as_json:
            click.echo(json.dumps(doc))
        else:
            click.echo(f"{s.address}  until {doc['until']}  {s.status}  {s.case_key}")
    if not found and not as_json:
        click.echo("no address is suppressed")


@suppress.command("drop")
@CONFIG
@click.argument("address", metavar="ADDR")
def suppress_drop(config_file: Path, address: str) -> None:
    """Lift the suppression of ADDR: masd's own mails go to it again."""
    from masd.store import bounces

    wanted = address.strip().strip("<>").lower()
    with _store(config_file) as store:
        dropped = store.write_sync(lambda db: bounces.drop_suppression(db, wanted))
    if not dropped:
        click.echo(f"masd: {wanted} is not suppressed", err=True)
        raise SystemExit(1)
    click.echo(f"{wanted}: no longer suppressed")
