"""``masd case erase KEY``: remove one case with everything it holds.

It asks the running masd (``POST /mas/v0.1/cases/{key}/erase``), so the
``handoff.cancel`` to an open handoff's mode goes out at once; when no masd
answers it erases in the store itself, and masd sends the cancel when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import click

from masd.cli.common import CONFIG, load
from masd.cli.watch import _offline_runtime, _read_store

if TYPE_CHECKING:
    from masd.cli.admin_client import Answer
    from masd.config import Config


@click.command("erase")
@CONFIG
@click.argument("key", metavar="KEY")
def case_erase(config_file: Path, key: str) -> None:
    """Erase case KEY: its mail, thread, handoffs, statuses and queued sends.

    KEY is the case's key (ticket=GS-1@help.example, as `masd case list`
    shows it).  An open handoff is cancelled first: its mode is sent a
    handoff.cancel with reason erased.  The feed keeps one case.erased entry
    with the case's address and key; nothing else of the case remains.
    """
    from masd.cli.admin_client import AdminError, NotRunning, call
    from masd.read.case_views import normalize_key

    config, key = load(config_file), normalize_key(key)
    try:
        answer = call(config, "POST", f"/mas/v0.1/cases/{quote(key, safe='@=')}/erase")
    except AdminError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    except NotRunning as exc:
        click.echo(f"masd: {exc}; erasing in the store itself", err=True)
        answer = _erase_in_store(config, key)
    body = answer.body
    if answer.status != 200:
        click.echo(f"masd: {body.get('error')}: {body.get('detail')}", err=True)
        raise SystemExit(1)
    counts = " ".join(f"{table}={n}" for table, n in body["erased"].items())
    click.echo(f"erased {key}: {counts}")


def _erase_in_store(config: Config, key: str) -> Answer:
    """The erase as one job on the store (no masd running)."""
    from masd.cli.admin_client import Answer
    from masd.service import erase as erasing

    rt, now = _offline_runtime(config)
    with _read_store(config) as store:
        try:
            done = store.write_sync(lambda tx: erasing.erase(rt, tx, key, now))
        except erasing.UnknownCase as exc:
            return Answer(404, {"ok": False, "error": exc.code, "detail": exc.detail})
    return Answer(200, {"ok": True, "erased": done.counts})
