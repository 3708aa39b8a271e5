"""The ``masd`` command line: a click group, one function per command."""

from __future__ import annotations

from pathlib import Path

import click

from masd import __version__
from masd.config import ConfigErrors, format_summary, load_config


@click.group()
@click.version_option(__version__, prog_name="masd")
def main() -> None:
    """masd: the email side of the MAS mode contract v0.1."""


@main.command("check-config")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def check_config(file: Path) -> None:
    """Validate FILE and every secret it names; print a summary, or every error."""
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
    click.echo(format_summary(config))
