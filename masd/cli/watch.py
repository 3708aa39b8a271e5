"""The operator's commands: ``masd case``, ``masd tail``, ``masd queue``, ``masd explain``.

Reading commands open the store read-only beside a running masd (WAL: they
never wait for its writer) and never migrate it.  ``masd queue retry`` and
``drop`` ask the running masd through its admin API, so its outbox acts at
once; when no masd answers they change the store themselves.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from masd.cli.common import CONFIG, DEFAULT_CONFIG, load

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from masd.cli.admin_client import Answer
    from masd.config import Config
    from masd.service import Runtime
    from masd.store import StoreHandle, Tx

#: How often ``masd tail --follow`` looks for new events.
TAIL_POLL_SECONDS = 0.25
OUTBOX_PATH = "/mas/v0.1/admin/outbox"
T = TypeVar("T")


def _read_store(config: Config) -> StoreHandle:
    """The store, opened to read: never migrated here (``masd db migrate`` does that).

    Either kind: an SQLite file, or the PostgreSQL database several hosts share."""
    from masd.core.errors import MasdError
    from masd.store import open_store

    try:
        return open_store(config.server.database, migrate=False)
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None


def _offline_runtime(config: Config) -> tuple[Runtime, float]:
    """What a change made in the store itself (no masd running) runs with: a runtime
    giving fresh random ids, and the time now."""
    import secrets

    from masd.clock import Clock
    from masd.service import Runtime

    return Runtime(config, lambda: secrets.token_hex(16)), Clock().now()


def _one_case(store: StoreHandle, name: str) -> str:
    """The key of the one case ``name`` names (address, key or id), or exit 1 saying why."""
    from masd.core.address import parse_address
    from masd.core.errors import AddressError
    from masd.read.case_views import keys_named

    if "@" in name:
        try:
            parse_address(name, delimiter="")
        except AddressError as exc:
            click.echo(f"masd: {name}: {exc.detail}", err=True)
            raise SystemExit(1) from None
    keys = store.read_sync(lambda db: keys_named(db, name))
    if len(keys) == 1:
        return keys[0]
    if not keys:
        click.echo(f"masd: no case {name}", err=True)
    else:
        listed = ", ".join(keys[:10]) + (", ..." if len(keys) > 10 else "")
        click.echo(
            f"masd: {name} is ambiguous: {len(keys)} cases have that id ({listed}); "
            "give the address",
            err=True,
        )
    raise SystemExit(1)


def _json(doc: object) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


# --------------------------------------------------------------------------- masd case


@click.group()
def case() -> None:
    """Read cases and their threads (docs/protocol.md §16)."""


@case.command("show")
@CONFIG
@click.argument("case_name", metavar="CASE")
@click.option("--json", "as_json", is_flag=True, help="The case and its thread as JSON.")
@click.option(
    "--whole-text",
    "whole",
    is_flag=True,
    help="Each mail's whole text, quoted mail and signature too.",
)
def case_show(config_file: Path, case_name: str, as_json: bool, whole: bool) -> None:
    """Print CASE and its thread as a timeline, with each send's delivery state and,
    under each mail received, the sender's own words (its reply_text: the text less
    quoted mail and signature), or with --whole-text its whole text.

    CASE is the case's address or key in any spelling (ticket=GS-1@help.example),
    or its id alone (gs-1) when one case has it.
    """
    from masd.cli.text import format_case
    from masd.read.case_views import case_json, thread_json

    with _read_store(load(config_file)) as store:
        key = _one_case(store, case_name)
        found = store.read_sync(lambda db: case_json(db, key))
        thread = store.read_sync(lambda db: thread_json(db, key, 0, 10**9))
        texts = _texts(store, thread, "text" if whole else "reply_text")
    assert found is not None
    if as_json:
        _json({**found, "thread": thread})
    else:
        click.echo(format_case(found, thread, texts), nl=False)


def _texts(store: StoreHandle, thread: dict[str, Any] | None, field: str) -> dict[str, str]:
    """The ``field`` (``text`` or ``reply_text``) of each mail.in of ``thread``, by
    message_ref (docs/protocol.md §16.6, §16.8)."""
    from masd.read.messages import message

    refs = [
        str(e["message_ref"])
        for e in (thread or {}).get("entries") or []
        if e.get("kind") == "mail.in" and e.get("message_ref")
    ]

    def read(tx: Tx) -> dict[str, str]:
        texts: dict[str, str] = {}
        for ref in refs:
            found = message(tx, ref)
            if found is not None:
                texts[ref] = str(found.event.get(field) or found.event.get("text") or "")
        return texts

    return store.read_sync(read)


@case.command("list")
@CONFIG
@click.option(
    "--limit", type=click.IntRange(1, None), default=50, show_default=True, help="How many cases."
)
@click.option(
    "--state",
    type=click.Choice(["open", "closed"]),
    default=None,
    help="open: a handoff is not closed yet (a mode is at work); closed: none is.",
)
@click.option("--participant", default=None, help="Only cases of this address.")
@click.option("--domain", default=None, help="Only cases of this domain.")
@click.option("--after", default=None, metavar="CURSOR", help="The page after this cursor.")
@click.option("--json", "as_json", is_flag=True, help="The page as JSON (as GET /mas/v0.1/cases).")
def case_list(
    config_file: Path,
    limit: int,
    state: str | None,
    participant: str | None,
    domain: str | None,
    after: str | None,
    as_json: bool,
) -> None:
    """List cases, most recently active first, under a header row.

    The same filters as GET /mas/v0.1/cases (docs/protocol.md §16.4). When
    more cases follow, the last line gives the --after of the next page.
    """
    from masd.cli.text import format_cases
    from masd.read.case_views import CaseFilter, cases_json, parse_case_cursor

    config = load(config_file)
    pos = None if after is None else parse_case_cursor(after)
    if after is not None and pos is None:
        click.echo(f"masd: --after: {after!r} is not a cursor of the case list", err=True)
        raise SystemExit(2)
    where = CaseFilter(state, participant, domain)
    with _read_store(config) as store:
        doc = store.read_sync(lambda db: cases_json(db, pos, limit, where))
    if as_json:
        _json(doc)
        return
    click.echo(format_cases(doc), nl=False)
    if doc["next"] is not None:
        click.echo(f"(more: --after {doc['next']})")


# --------------------------------------------------------------------------- masd tail


@click.command()
@CONFIG
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(0, 10_000),
    default=10,
    show_default=True,
    help="How many of the latest events to print first.",
)
@click.option("-f", "--follow", is_flag=True, help="Then print each new event as it commits.")
@click.option("--case", "case_name", default=None, metavar="CASE", help="Only this case's events.")
@click.option("--json", "as_json", is_flag=True, help="One event a line, as JSON (as the feed).")
def tail(config_file: Path, count: int, follow: bool, case_name: str | None, as_json: bool) -> None:
    """Print the latest events of the event feed; with --follow, each new one as it commits.

    An event is a thread entry of any case (docs/protocol.md §16.5): time,
    case, kind and what happened. Ctrl-C ends --follow.
    """
    from masd.read.feed import latest, page, parse_cursor

    with _read_store(load(config_file)) as store:
        key = None if case_name is None else _one_case(store, case_name)
        found = store.read_sync(lambda db: latest(db, count, key))
        try:
            _print_events(found.events if count else [], as_json)
            after = parse_cursor(found.next) or 0
            with _until_signalled() as stopped:
                while follow and not stopped.is_set():
                    found = store.read_sync(functools.partial(page, after=after, case_key=key))
                    _print_events(found.events, as_json)
                    after = parse_cursor(found.next) or after
                    if not found.events:
                        stopped.wait(TAIL_POLL_SECONDS)
        except KeyboardInterrupt:  # before the follow began
            pass
        except BrokenPipeError:  # `masd tail | head`: the reader is gone
            sys.stderr.close()


@contextlib.contextmanager
def _until_signalled() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs, in place of an exception.

    A ``KeyboardInterrupt`` can land anywhere, inside a read that holds the store's lock
    among them, and leave the store unable to close: the follow loop reads the event
    between reads instead, and ends with the store closed in order."""
    stopped = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = [signal.signal(s, lambda *_: stopped.set()) for s in signals]
    try:
        yield stopped
    finally:
        for s, handler in zip(signals, previous, strict=True):
            signal.signal(s, handler)


def _print_events(events: list[dict[str, Any]], as_json: bool) -> None:
    from masd.cli.text import format_event

    for event in events:
        line = json.dumps(event, ensure_ascii=False) if as_json else format_event(event)
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- masd queue


_QUEUE_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The masd TOML file.  [default: the one given to queue, else /etc/masd/masd.toml]",
)


def _queue_config(config_file: Path | None) -> Config:
    ctx = click.get_current_context()
    given = ctx.find_root().meta.get("masd.queue.config")
    return load(config_file or given or DEFAULT_CONFIG)


@click.group(invoke_without_command=True)
@CONFIG
@click.pass_context
def queue(ctx: click.Context, config_file: Path) -> None:
    """The outbound queue, as postqueue -p and postsuper: list, retry, drop.

    Without a command: list.
    """
    ctx.find_root().meta["masd.queue.config"] = config_file
    if ctx.invoked_subcommand is None:
        ctx.invoke(queue_list, config_file=config_file)


@queue.command("list")
@_QUEUE_CONFIG
@click.option(
    "--limit",
    type=click.IntRange(1, None),
    default=100,
    show_default=True,
    help="How many items at most (waiting ones first, then failed ones).",
)
@click.option("--json", "as_json", is_flag=True, help="As GET /mas/v0.1/admin/outbox.")
def queue_list(config_file: Path | None, limit: int = 100, as_json: bool = False) -> None:
    """What waits to go out (queued, retrying), then what masd gave up on (failed).

    Each item: id, state, attempts, when queued, next try, case, what it is
    and where it goes; its last error on the line below.
    """
    from masd.cli.text import format_items
    from masd.read.queue_items import listing

    with _read_store(_queue_config(config_file)) as store:
        doc = store.read_sync(lambda db: listing(db, limit))
    if as_json:
        _json(doc)
    else:
        click.echo(format_items(doc["items"]), nl=False)


@queue.command("retry")
@_QUEUE_CONFIG
@click.argument("item_id", metavar="ID", type=click.IntRange(1, None), required=False)
@click.option("--all", "every", is_flag=True, help="Every item waiting for a later try.")
def queue_retry(config_file: Path | None, item_id: int | None, every: bool) -> None:
    """Try item ID now (a failed one is tried again), or --all waiting items.

    Asks the running masd (its admin API), whose outbox sends at once.
    """
    if (item_id is None) == (not every):
        raise click.UsageError("give an item ID or --all, not both")
    _change(_queue_config(config_file), "retry", item_id)


@queue.command("drop")
@_QUEUE_CONFIG
@click.argument("item_id", metavar="ID", type=click.IntRange(1, None))
def queue_drop(config_file: Path | None, item_id: int) -> None:
    """Withdraw item ID: it is not sent; its case's thread records it as
    dropped by the operator (a dropped handoff.request fails its handoff)."""
    _change(_queue_config(config_file), "drop", item_id)


def _change(config: Config, what: str, item_id: int | None) -> None:
    from masd.cli.admin_client import AdminError, NotRunning, call

    path = f"{OUTBOX_PATH}/retry" if item_id is None else f"{OUTBOX_PATH}/{item_id}/{what}"
    try:
        answer = call(config, "POST", path)
    except AdminError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    except NotRunning as exc:
        click.echo(
            f"masd: {exc}; changing the store itself (masd acts on it when it runs)", err=True
        )
        answer = _change_in_store(config, what, item_id)
    body = answer.body
    if answer.status != 200:
        click.echo(f"masd: {body.get('error')}: {body.get('detail')}", err=True)
        raise SystemExit(1)
    if item_id is None:
        ids = body.get("retried") or []
        click.echo(f"retried {len(ids)} item{'' if len(ids) == 1 else 's'}: due now")
        return
    item = body["item"]
    if what == "drop":
        click.echo(f"dropped {item_id} ({item['case'] or 'no case'}): the thread records it")
    else:
        click.echo(f"retried {item_id}: {item['state']}, next try {item['next_attempt_at']}")


def _change_in_store(config: Config, what: str, item_id: int | None) -> Answer:
    """The change of :func:`_change` as one job on the store (no masd running)."""
    from masd.cli.admin_client import Answer
    from masd.read.queue_items import item_json
    from masd.service import queue_actions as q

    rt, now = _offline_runtime(config)
    with _read_store(config) as store:
        try:
            if item_id is None:
                retried = store.write_sync(lambda tx: q.retry_waiting(tx, now))
                return Answer(200, {"ok": True, "retried": retried.ids})
            job = q.retry if what == "retry" else q.drop
            done = store.write_sync(lambda tx: job(rt, tx, item_id, now))
        except q.QueueError as exc:
            return Answer(exc.status, {"ok": False, "error": exc.code, "detail": exc.detail})
    return Answer(200, {"ok": True, "item": item_json(done.row)})


# --------------------------------------------------------------------------- masd explain


@click.command()
@CONFIG
@click.argument("file", type=click.Path(allow_dash=True, dir_okay=True))
@click.option("--rcpt", default=None, help="The envelope recipient (default: from the headers).")
@click.option("--mail-from", default=None, help="The envelope sender (default: the From).")
@click.option("--json", "as_json", is_flag=True, help="The explanation as JSON.")
def explain(
    config_file: Path, file: str, rcpt: str | None, mail_from: str | None, as_json: bool
) -> None:
    """What masd would do with the mail in FILE (- for stdin), as a dry run.

    Writes nothing and sends nothing: the LMTP answer, decided as the LMTP
    listener decides it (a case or bounce address is looked up in the store,
    opened read-only), the recipient as parsed, the trusted headers and the
    Authentication-Results chosen, the DMARC verdict, automated or not and why,
    the participant, the send caps, and what masd would do (open a case, hand
    off, acknowledge, record a bounce, refuse, with the reason). What is still
    assumed is said. Without --rcpt the first Delivered-To, X-Original-To, To or
    Cc address at a configured domain. FILE must be a regular file; it is read
    up to server.max_message_bytes.
    """
    from masd.clock import Clock
    from masd.ops.explain import MailFileError, default_recipient, format_explained, read_mail
    from masd.ops.explain import explain as run

    config = load(config_file)
    try:
        raw = read_mail(file, config.server.max_message_bytes, sys.stdin.buffer)
    except MailFileError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(2) from exc
    rcpt = rcpt or default_recipient(raw, config)
    if rcpt is None:
        domains = ", ".join(sorted(config.domains)) or "(none)"
        click.echo(f"masd: no recipient at a configured domain ({domains}); give --rcpt", err=True)
        raise SystemExit(2)
    with contextlib.ExitStack() as stack:

        def read(fn: Callable[[Tx], T], /) -> T:  # the store, opened when first asked
            database = config.server.database
            if isinstance(database, Path) and not database.exists():
                said = f"masd: {rcpt} is looked up in the store, and there is no store at"
                click.echo(f"{said} {database} (server.database)", err=True)
                raise SystemExit(1)
            if not opened:
                opened.append(stack.enter_context(_read_store(config)))
            return opened[0].read_sync(fn)

        opened: list[StoreHandle] = []
        found = run(config, raw, rcpt, mail_from=mail_from, now=Clock().now(), read=read)
    if as_json:
        _json(found.json())
    else:
        click.echo(format_explained(found), nl=False)
