"""The ``masd`` command line: a click group, one function per command."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from masd import __version__
from masd.config import Config, ConfigErrors, format_summary, load_config
from masd.core.errors import MasdError

if TYPE_CHECKING:
    from masd.store import Store


@click.group()
@click.version_option(__version__, prog_name="masd")
def main() -> None:
    """masd: the email side of the MAS mode contract v0.1."""


@main.command("check-config")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def check_config(file: Path) -> None:
    """Validate FILE and every secret it names; print a summary, or every error.

    Each error names its key path and the value refused; a misspelt key gets
    the nearest known key suggested. Warnings (a secret others can read, a
    mode without endpoint) go to stderr. Exit status 1 on any error.
    """
    config = _load(file)
    click.echo(format_summary(config))


def _load(file: Path) -> Config:
    """The config, or every error on stderr and exit status 1."""
    try:
        config = load_config(file)
    except ConfigErrors as exc:
        for error in exc.errors:
            click.echo(str(error), err=True)
        count = len(exc.errors)
        click.echo(f"masd: {count} error{'s' if count != 1 else ''} in {file}", err=True)
        raise SystemExit(1) from None
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    return config


_CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/etc/masd/masd.toml"),
    show_default=True,
    help="The masd TOML file.",
)


@main.command()
@_CONFIG
@click.option(
    "--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING or ERROR."
)
@click.option(
    "--test-clock",
    is_flag=True,
    help="Run on a clock that moves only when told (POST /mas/v0.1/test/clock with the admin "
    "secret), for conformance flows. Refused unless both listeners are on loopback.",
)
def serve(config_file: Path, log_level: str, test_clock: bool) -> None:
    """Run masd: the LMTP and HTTP listeners, the outbox and the deadline timer.

    Stops cleanly on SIGTERM or SIGINT: stops accepting, finishes what is in
    flight, exits 0.
    """
    from masd.app import App, configure_logging
    from masd.clock import Clock, TestClock
    from masd.store import StoreError

    config = _load(config_file)
    clock = Clock()
    if test_clock:
        exposed = [
            f"server.{name} = {listen}"
            for name, listen in (("lmtp", config.server.lmtp), ("http", config.server.http))
            if not _local(listen)
        ]
        if exposed or config.server.admin_token is None:
            why = ", ".join(exposed) or "no server.admin_token_file to guard it"
            click.echo(
                f"masd: --test-clock needs loopback listeners and an admin token: {why}", err=True
            )
            raise SystemExit(2)
        clock = TestClock()
    configure_logging(log_level)
    try:
        asyncio.run(App(config, clock=clock).run())
    except StoreError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    except OSError as exc:
        click.echo(f"masd: cannot listen: {exc}", err=True)
        raise SystemExit(1) from None
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None


def _local(listen: object) -> bool:
    """A unix socket, or TCP on a loopback address."""
    import ipaddress

    from masd.config import TcpListen

    if not isinstance(listen, TcpListen):
        return True
    if listen.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(listen.host).is_loopback
    except ValueError:
        return False


@main.command()
@_CONFIG
@click.option(
    "--messages", default=100, show_default=True, help="How many recent messages to look at."
)
def doctor(config_file: Path, messages: int) -> None:
    """Check listeners, store, recent mail's authentication, DKIM keys and peers.

    One line per check ("ok" or "FAIL", what, why); exit 1 when any failed.
    """
    from masd.doctor import diagnose, report

    text, ok = report(diagnose(_load(config_file), messages=messages))
    click.echo(text)
    raise SystemExit(0 if ok else 1)


@main.command()
def demo() -> None:
    """Run a demo on loopback: masd, a demo mode endpoint and a mail sink; print each thread."""
    from masd.demo import main as run_demo

    raise SystemExit(run_demo())


@main.group()
def db() -> None:
    """The store: migrations and backups."""


@db.command("migrate")
@_CONFIG
def db_migrate(config_file: Path) -> None:
    """Apply pending migrations to the store named in the config."""
    from masd.store import StoreError, migrate

    config = _load(config_file)
    try:
        applied = migrate(config.server.database)
    except StoreError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"applied: {', '.join(applied)}" if applied else "up to date")


@db.command("backup")
@_CONFIG
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def db_backup(config_file: Path, dest: Path) -> None:
    """Copy the store to DEST online (SQLite backup API), while masd runs."""
    from masd.store import StoreError, backup

    config = _load(config_file)
    try:
        backup(config.server.database, dest)
    except StoreError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"backed up {config.server.database} to {dest}")


@main.group()
def case() -> None:
    """Read cases and their threads (docs/protocol.md §16)."""


def _read_store(config: Config) -> Store:
    """The store, opened to read: never migrated here (``masd db migrate`` does that)."""
    from masd.store import Store, StoreError

    try:
        return Store.open(config.server.database, migrate=False)
    except StoreError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None


@case.command("show")
@_CONFIG
@click.argument("case_name", metavar="CASE")
@click.option("--json", "as_json", is_flag=True, help="The case and its thread as JSON.")
def case_show(config_file: Path, case_name: str, as_json: bool) -> None:
    """Print CASE and its thread as a timeline, with each send's delivery state.

    CASE is the case's address or key in any spelling (ticket=GS-1@help.example),
    or its id alone (gs-1) when one case has it.
    """
    from masd.core.address import parse_address
    from masd.core.errors import AddressError
    from masd.readside import case_json, format_case, keys_named, thread_json

    config = _load(config_file)
    if "@" in case_name:
        try:
            parse_address(case_name, delimiter="")
        except AddressError as exc:
            click.echo(f"masd: {case_name}: {exc.detail}", err=True)
            raise SystemExit(1) from None
    with _read_store(config) as store:
        keys = store.read_sync(lambda db: keys_named(db, case_name))
        if len(keys) != 1:
            click.echo(f"masd: {_no_one_case(case_name, keys)}", err=True)
            raise SystemExit(1)
        key = keys[0]
        found = store.read_sync(lambda db: case_json(db, key))
        thread = store.read_sync(lambda db: thread_json(db, key, 0, 10**9))
    assert found is not None
    if as_json:
        click.echo(json.dumps({**found, "thread": thread}, indent=2, ensure_ascii=False))
        return
    click.echo(format_case(found, thread), nl=False)


def _no_one_case(name: str, keys: list[str]) -> str:
    if not keys:
        return f"no case {name}"
    listed = ", ".join(keys[:10]) + (", ..." if len(keys) > 10 else "")
    return f"{name} is ambiguous: {len(keys)} cases have that id ({listed}); give the address"


_STATE = click.option(
    "--state",
    type=click.Choice(["open", "closed"]),
    default=None,
    help="open: a handoff is not closed yet (a mode is at work); closed: none is.",
)


@case.command("list")
@_CONFIG
@click.option(
    "--limit", type=click.IntRange(1, None), default=50, show_default=True, help="How many cases."
)
@_STATE
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
    from masd.readside import CaseFilter, cases_json, format_cases, parse_case_cursor

    config = _load(config_file)
    pos = None if after is None else parse_case_cursor(after)
    if after is not None and pos is None:
        click.echo(f"masd: --after: {after!r} is not a cursor of the case list", err=True)
        raise SystemExit(2)
    where = CaseFilter(state, participant, domain)
    with _read_store(config) as store:
        doc = store.read_sync(lambda db: cases_json(db, pos, limit, where))
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    click.echo(format_cases(doc), nl=False)
    if doc["next"] is not None:
        click.echo(f"(more: --after {doc['next']})")


@main.group()
def conformance() -> None:
    """The conformance suite (CONTRACT §7): play a role's flows against an implementation."""


@conformance.command("run")
@click.option("--role", type=click.Choice(["master", "slave"]), default=None, help="Default: both.")
@click.option("--flow", "names", multiple=True, metavar="NAME", help="Only this flow (repeatable).")
@click.option(
    "--target",
    default=None,
    metavar="COMMAND",
    help="The implementation's command line; --config FILE (and --test-clock) are appended. "
    "Default: this masd.",
)
@click.option(
    "--flows",
    "flows_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The flows folder (holding master/ and slave/). Default: masd's conformance/flows.",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep each flow's configuration, store and log under this folder.",
)
@click.option("--verbose", "-v", is_flag=True, help="Print the target's log after a failure.")
def conformance_run(
    role: str | None,
    names: tuple[str, ...],
    target: str | None,
    flows_dir: Path | None,
    keep: Path | None,
    verbose: bool,
) -> None:
    """Run the flows; one line per flow, then "N passed, M failed". Exit 0 only if all pass."""
    import sys

    from masd.conformance.runner import command

    raise SystemExit(
        command(
            role=role,
            names=names,
            target=target,
            flows_dir=flows_dir,
            keep=keep,
            verbose=verbose,
            out=sys.stdout,
            err=sys.stderr,
        )
    )


@conformance.command("coverage")
@click.option(
    "--flows",
    "flows_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The flows folder. Default: masd's conformance/flows.",
)
def conformance_coverage(flows_dir: Path | None) -> None:
    """Print the clause-to-flows table of conformance/README.md."""
    from masd._resources import conformance_dir
    from masd.conformance.coverage import table
    from masd.conformance.flow import FlowError, load_flows

    try:
        flows = load_flows(flows_dir or conformance_dir() / "flows")
    except FlowError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(table(flows), nl=False)
