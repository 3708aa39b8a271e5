"""The ``masd`` command line: a click group, one function per command."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from masd import __version__
from masd.cli.common import CONFIG as _CONFIG
from masd.cli.common import DEFAULT_CONFIG
from masd.cli.common import load as _load
from masd.cli.db import backup_database, db_copy, migrate_database
from masd.cli.erase import case_erase
from masd.cli.mail import intake, message
from masd.cli.mcp import mcp
from masd.cli.reload import PID_FILE, reload
from masd.cli.suppress import suppress
from masd.cli.watch import case, explain, queue, tail
from masd.config import format_summary
from masd.conformance.peer.command import peer
from masd.core.errors import MasdError


@click.group()
@click.version_option(__version__, prog_name="masd")
def main() -> None:
    """masd: the email side of the MAS mode contract v0.1."""


@main.command("check-config")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"The masd TOML file.  [default: {DEFAULT_CONFIG}]",
)
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path), required=False)
def check_config(config_file: Path | None, file: Path | None) -> None:
    """Validate the configuration and every secret it names; print a summary, or every error.

    The file is given with --config, as to every other command; a FILE given
    alone is the same (the older form). Each error names its key path and the
    value refused; a misspelt key gets the nearest known key suggested.
    Warnings (a secret others can read, a mode without endpoint, a store
    masd could not open now: an SQLite file's directory missing, a
    PostgreSQL server refusing the connection or the login) go to stderr.
    Exit status 1 on any error; masd doctor fails on what is a warning here.
    """
    from masd.store.probe import open_problem

    if config_file is not None and file is not None and config_file != file:
        raise click.UsageError(f"two files given: --config {config_file} and {file}; give one")
    config = _load(config_file or file or DEFAULT_CONFIG)
    problem = open_problem(config.server.database)
    if problem is not None:
        click.echo(f"warning: server.database: {problem}", err=True)
    click.echo(format_summary(config))


#: The levels of ``masd serve --log-level``.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@main.command()
@_CONFIG
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="The least severe level logged.",
)
@click.option(
    "--test-clock",
    is_flag=True,
    help="Run on a clock that moves only when told (POST /mas/v0.1/test/clock with the admin "
    "secret), for conformance flows. Refused unless both listeners are on loopback.",
)
@PID_FILE
def serve(config_file: Path, log_level: str, test_clock: bool, pid_file: Path | None) -> None:
    """Run masd: the LMTP and HTTP listeners, the outbox and the deadline timer.

    Stops cleanly on SIGTERM or SIGINT: stops accepting, finishes what is in
    flight, exits 0. On SIGHUP (masd reload) re-reads the configuration files;
    masd reload finds masd by the pid file --pid-file or server.pid_file names.
    """
    from masd.app import App
    from masd.clock import Clock, TestClock
    from masd.logs import configure_logging
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
    configure_logging(log_level.upper(), config.server.log_format)
    pid_file = pid_file or config.server.pid_file
    try:
        asyncio.run(App(config, clock=clock, pid_file=pid_file).run())
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
    "--messages",
    type=click.IntRange(1, None),
    default=100,
    show_default=True,
    help="How many recent messages to look at.",
)
def doctor(config_file: Path, messages: int) -> None:
    """Check listeners, store, recent mail's authentication, DKIM keys and peers.

    One line per check ("ok" or "FAIL", what, why); exit 1 when any failed.
    """
    from masd.ops.doctor import diagnose, report

    text, ok = report(diagnose(_load(config_file), messages=messages))
    click.echo(text)
    raise SystemExit(0 if ok else 1)


@main.command()
def demo() -> None:
    """Run masd on loopback as master, then as slave; print each case's thread.

    \b
    Master part: type 'ticket' in the master role with a demo mode endpoint
      (a callback service): a new case, a callback, a callback that needs
      negotiation, a mode with no endpoint, automated mail left unanswered.
    Slave part: type 'case' in the slave role under a demo CRM (the master)
      that names the cases, answers mail and turns one case's transfers to
      the callback service, whose statuses masd relays back to it.

    Nothing leaves 127.0.0.1: outbound mail goes to an SMTP sink.  Exit
    status 0 when every flow settled.
    """
    from masd.demo import main as run_demo

    raise SystemExit(run_demo())


@main.group()
def db() -> None:
    """The store: migrations, backups, copies between SQLite and PostgreSQL."""


db.add_command(db_copy)


@db.command("migrate")
@_CONFIG
def db_migrate(config_file: Path) -> None:
    """Apply pending migrations to the store named in the config (SQLite or PostgreSQL)."""
    config = _load(config_file)
    try:
        applied = migrate_database(config.server.database)
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"applied: {', '.join(applied)}" if applied else "up to date")


@db.command("backup")
@_CONFIG
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def db_backup(config_file: Path, dest: Path) -> None:
    """Copy the store to DEST online (SQLite backup API), while masd runs.

    A PostgreSQL store is refused: back it up with pg_dump.
    """
    config = _load(config_file)
    try:
        backup_database(config.server.database, dest)
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"backed up {config.server.database} to {dest}")


@main.group()
def conformance() -> None:
    """The conformance suite (docs/protocol.md §19): play a role's flows against an
    implementation.
    """


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
@click.option(
    "--database",
    default=None,
    metavar="URI",
    help="Play every flow against masd on PostgreSQL: a postgresql:// URI of a database "
    "the runner may create databases from (each flow gets a fresh one, dropped after). "
    "Default: each flow's own SQLite file.",
)
@click.option(
    "--database-password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The PostgreSQL password for --database, on one line (mode 0600); else libpq's own means.",
)
def conformance_run(
    role: str | None,
    names: tuple[str, ...],
    target: str | None,
    flows_dir: Path | None,
    keep: Path | None,
    verbose: bool,
    database: str | None,
    database_password_file: Path | None,
) -> None:
    """Run the flows; one line per flow, then "N passed, M failed". Exit 0 only if all pass."""
    import sys

    from masd.cli.db import _password
    from masd.conformance.databases import FlowDatabases
    from masd.conformance.runner import command

    if database is not None and not database.startswith(("postgresql://", "postgres://")):
        raise click.BadParameter("a postgresql:// URI", param_hint="--database")
    password = None if database_password_file is None else _password(database_password_file)

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
            databases=FlowDatabases(database, password),
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


conformance.add_command(peer)  # masd conformance peer mode|master (masd/conformance/peer)

# The operator's view (docs/operations.md, "Watching masd").
case.add_command(case_erase)
for _command in (case, message, intake, tail, queue, explain, reload, suppress, mcp):
    main.add_command(_command)
