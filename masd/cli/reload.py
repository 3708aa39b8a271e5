"""``masd reload``: make a running masd re-read its configuration files."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click

from masd.service import reloading

DEFAULT_PID_FILE = Path("/run/masd/masd.pid")

#: ``--pid-file FILE`` of ``masd serve`` and ``masd reload``.
PID_FILE = click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Where masd writes its pid and each reload's outcome (the unit uses {DEFAULT_PID_FILE}).",
)


@click.command("reload")
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_PID_FILE,
    show_default=True,
    help="The pid file of the running masd (masd serve --pid-file).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the outcome.",
)
def reload(pid_file: Path, timeout: float) -> None:
    """Make the running masd re-read masd.toml and its domain files (as SIGHUP does).

    A valid configuration replaces the running one without dropping a
    connection; an invalid one (or one changing a listener, the database or
    another setting bound at start) is refused and the running one kept.
    Prints the outcome; exit status 0 when applied, 1 when refused, 2 when no
    running masd answered.
    """
    try:
        pid = int(pid_file.read_text("ascii").strip())
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        click.echo(f"masd reload: cannot read {pid_file}: {why} (is masd running?)", err=True)
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
