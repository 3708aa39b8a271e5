"""What every ``masd`` command that reads a configuration shares."""

from __future__ import annotations

from pathlib import Path

import click

from masd.config import Config, ConfigErrors, load_config


def load(file: Path) -> Config:
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


DEFAULT_CONFIG = Path("/etc/masd/masd.toml")

#: ``--config FILE``, default /etc/masd/masd.toml.
CONFIG = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG,
    show_default=True,
    help="The masd TOML file.",
)
