"""The mail itself and the intakes, for an operator: ``masd message show``,
``masd intake list`` and ``masd intake resend`` (docs/protocol.md §16.6, §16.8, §16.9).

``message show`` and ``intake list`` read the store beside a running masd, as
``masd case show`` does; ``intake resend`` asks the running masd (its admin API), whose
outbox sends at once, and changes the store itself when no masd answers.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from masd.cli.common import CONFIG, load
from masd.cli.watch import _json, _offline_runtime, _read_store

if TYPE_CHECKING:
    from masd.cli.admin_client import Answer
    from masd.config import Config
    from masd.store import StoreHandle

INTAKES_PATH = "/mas/v0.1/intakes"


@click.group()
def message() -> None:
    """Read a recorded message: its event, its raw bytes, its attachments."""


@message.command("show")
@CONFIG
@click.argument("ref", metavar="REF")
@click.option("--raw", is_flag=True, help="The bytes as received over LMTP.")
@click.option(
    "--attachment",
    "index",
    type=click.IntRange(0, None),
    default=None,
    metavar="N",
    help="Attachment N (from 0, as listed), decoded.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the bytes of --raw or --attachment to FILE instead of stdout.",
)
@click.option("--json", "as_json", is_flag=True, help="As GET /mas/v0.1/messages/REF.")
@click.option(
    "--whole-text",
    "whole",
    is_flag=True,
    help="After the sender's own words, the whole text (quoted mail and signature too).",
)
def message_show(
    config_file: Path,
    ref: str,
    raw: bool,
    index: int | None,
    output: Path | None,
    as_json: bool,
    whole: bool,
) -> None:
    """Print message REF (a message_ref, as in a mail.in entry): who sent it, to whom,
    its authentication, its attachments and the sender's own words (its reply_text:
    the text less quoted mail and signature); --whole-text adds the whole text.

    With --raw, the bytes as received; with --attachment N, attachment N's decoded
    bytes (to stdout, or to FILE with -o).
    """
    from masd.cli.text import format_message
    from masd.read import messages

    if raw and index is not None:
        raise click.UsageError("give --raw or --attachment, not both")
    with _read_store(load(config_file)) as store:
        found = store.read_sync(lambda tx: messages.message(tx, ref))
        if found is None:
            click.echo(f"masd: no message {ref}", err=True)
            raise SystemExit(1)
        if not raw and index is None:
            if as_json:
                _json(found.doc)
            else:
                click.echo(format_message(found.doc, whole=whole), nl=False)
            return
        _write_bytes(store, found.doc["message"], index, output)


def _write_bytes(
    store: StoreHandle, doc: dict[str, Any], index: int | None, output: Path | None
) -> None:
    from masd.read import message_bytes as mb

    ref = doc["message_ref"]
    attachments = doc["event"].get("attachments") or []
    if index is not None and index >= len(attachments):
        click.echo(f"masd: message {ref} has {len(attachments)} attachments, no {index}", err=True)
        raise SystemExit(1)

    async def copy(out: IO[bytes]) -> None:
        if index is None:
            pieces = mb.raw_pieces(store, ref, 0, doc["size"])
        else:
            listed = attachments[index]
            span = await store.read(lambda tx: mb.locate(tx, ref, index, listed))
            pieces = mb.decoded_pieces(store, ref, span, 0, listed["size"] - 1)
        async for piece in pieces:
            out.write(piece)

    try:
        if output is None:
            asyncio.run(copy(sys.stdout.buffer))
            sys.stdout.buffer.flush()
        else:
            with output.open("wb") as out:
                asyncio.run(copy(out))
    except mb.Mismatch as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None


@click.group()
def intake() -> None:
    """Slave-role intakes: mail to type@domain waiting for its master's case.assign."""


@intake.command("list")
@CONFIG
@click.option(
    "--state",
    type=click.Choice(["pending", "assigned"]),
    default=None,
    help="Only the intakes waiting for case.assign, or only those assigned.  "
    "[default: both, as GET /mas/v0.1/intakes]",
)
@click.option(
    "--limit",
    type=click.IntRange(1, None),
    default=100,
    show_default=True,
    help="At most this many intakes.",
)
@click.option("--after", default=None, metavar="CURSOR", help="The page after this cursor.")
@click.option("--json", "as_json", is_flag=True, help="As GET /mas/v0.1/intakes.")
def intake_list(
    config_file: Path, state: str | None, limit: int, after: str | None, as_json: bool
) -> None:
    """List intakes, oldest first, pending and assigned alike (as GET /mas/v0.1/intakes):
    pending ones wait for their master's case.assign; --state pending shows only those."""
    from masd.cli.text import format_intakes
    from masd.read.messages import intakes_json, parse_intake_cursor

    pos = 0 if after is None else parse_intake_cursor(after)
    if pos is None:
        click.echo(f"masd: --after: {after!r} is not a cursor of the intake list", err=True)
        raise SystemExit(2)
    with _read_store(load(config_file)) as store:
        doc = store.read_sync(lambda tx: intakes_json(tx, state=state, after=pos, limit=limit))
    if as_json:
        _json(doc)
        return
    click.echo(format_intakes(doc), nl=False)
    if len(doc["intakes"]) == limit:
        click.echo(f"(more: --after {doc['next']})")


@intake.command("resend")
@CONFIG
@click.argument("ref", metavar="REF")
def intake_resend(config_file: Path, ref: str) -> None:
    """Send case.intake of pending intake REF to its master again, with a fresh id
    (the master answered 200 and lost it before its case.assign)."""
    from masd.cli.admin_client import AdminError, NotRunning, call

    config = load(config_file)
    try:
        answer = call(config, "POST", f"{INTAKES_PATH}/{ref}/resend")
    except AdminError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    except NotRunning as exc:
        click.echo(f"masd: {exc}; queueing it in the store (sent when masd runs)", err=True)
        answer = _resend_in_store(config, ref)
    body = answer.body
    if answer.status != 200:
        click.echo(f"masd: {body.get('error')}: {body.get('detail')}", err=True)
        raise SystemExit(1)
    click.echo(
        f"resent {ref}: case.intake id {body['id']} queued (outbox item {body['outbox_id']})"
    )


def _resend_in_store(config: Config, ref: str) -> Answer:
    from masd.cli.admin_client import Answer
    from masd.service import intakes

    rt, now = _offline_runtime(config)
    with _read_store(config) as store:
        try:
            done = store.write_sync(lambda tx: intakes.resend(rt, tx, ref, now))
        except intakes.IntakeError as exc:
            return Answer(exc.status, {"ok": False, "error": exc.code, "detail": exc.detail})
    return Answer(200, {"ok": True, "id": done.message_id, "outbox_id": done.outbox_id})
