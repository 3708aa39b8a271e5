"""``masd reload``: make a running masd re-read its configuration files."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click

from masd.cli.common import DEFAULT_CONFIG
from masd.config import ConfigErrors, pid_file_of
from masd.service import reloading

DEFAULT_PID_FILE = Path("/run/masd/masd.pid")

#: ``--pid-file FILE`` of ``masd serve`` and ``masd reload``.
PID_FILE = click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where masd writes its pid and each reload's outcome, which masd reload reads "
    f"(default: server.pid_file, else none; the unit uses {DEFAULT_PID_FILE}).",
)


def _pid_file_of(config_file: Path | None) -> Path:
    """The configuration's ``server.pid_file``; :data:`DEFAULT_PID_FILE` when it names none,
    or when no ``--config`` was given and the default file does not exist."""
    if config_file is None and not DEFAULT_CONFIG.exists():
        return DEFAULT_PID_FILE
    try:
        found = pid_file_of(config_file or DEFAULT_CONFIG)
    except ConfigErrors as exc:
        for error in exc.errors:
            click.echo(f"masd reload: {error}", err=True)
        click.echo("masd reload: give the pid file with --pid-file", err=True)
        raise SystemExit(2) from None
    return found or DEFAULT_PID_FILE


@click.command("reload")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The masd TOML file whose server.pid_file names the pid file.  "
    f"[default: {DEFAULT_CONFIG}]",
)
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The pid file of the running masd (masd serve --pid-file), instead of the "
    f"configuration's server.pid_file.  [default: server.pid_file, else {DEFAULT_PID_FILE}]",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the outcome.",
)
def reload(config_file: Path | None, pid_file: Path | None, timeout: float) -> None:
    """Make the running masd re-read masd.toml and its domain files (as SIGHUP does).

    The running masd is found by its pid file, which masd serve writes only
    when told where: serve --pid-file FILE, or server.pid_file in masd.toml
    (the systemd unit passes --pid-file /run/masd/masd.pid). masd reload
    reads the one --pid-file names, else server.pid_file of --config, else
    /run/masd/masd.pid.

    A valid configuration replaces the running one without dropping a
    connection; an invalid one (or one changing a listener, the database or
    another setting bound at start) is refused and the running one kept.
    Prints the outcome; exit status 0 when applied, 1 when refused, 2 when no
    running masd answered.
    """
    pid_file = pid_file or _pid_file_of(config_file)
    try:
        pid = int(pid_file.read_text("ascii").strip())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        click.echo(
            f"masd reload: cannot read {pid_file}: {why} (is masd running? masd serve writes "
            "its pid file with --pid-file FILE or server.pid_file)",
            err=True,
        )
        raise SystemExit(2) from None
    before, _ = reloading.read_status(pid_file)
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        click.echo(f"masd reload: cannot signal masd (pid {pid}): {exc.strerror}", err=True)
        raise SystemExit(2) from None
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        reloads, outcome = reloading.read_status(pid_file)
        if reloads > before and outcome is not None:
            for line in outcome.lines:
                click.echo(line, err=not outcome.ok)
            raise SystemExit(0 if outcome.ok else 1)
        time.sleep(0.05)
    click.echo(f"masd reload: no outcome from masd (pid {pid}) within {timeout:g}s", err=True)
    raise SystemExit(2)
