"""The command line as a whole: every option says what it is for, fixed sets are validated,
and every command that reads a configuration takes it as ``--config``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support.masd_process import write_master_config

from masd.cli import main


def commands(
    cmd: click.Command, path: tuple[str, ...] = ("masd",)
) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, (*path, name))


def test_every_option_has_help() -> None:
    missing = [
        f"{where} {'/'.join(p.opts)}"
        for where, cmd in commands(main)
        for p in cmd.params
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert missing == [], missing


def test_the_walk_sees_every_command() -> None:
    seen = {where for where, _ in commands(main)}
    for where in ("masd queue list", "masd conformance peer mode", "masd check-config"):
        assert where in seen
    # The check above fails for an option without help: shown on a command of its own.
    bare = click.Command("bare", params=[click.Option(["--limit"])])
    assert [p for p in bare.params if isinstance(p, click.Option) and not p.help]


#: Every command that reads masd.toml (the others read none).
READS_CONFIG = {
    "masd check-config",
    "masd serve",
    "masd doctor",
    "masd db migrate",
    "masd db backup",
    "masd case show",
    "masd case list",
    "masd case erase",
    "masd tail",
    "masd queue",
    "masd queue list",
    "masd queue retry",
    "masd queue drop",
    "masd explain",
    "masd message show",
    "masd intake list",
    "masd intake resend",
    "masd suppress list",
    "masd suppress drop",
    "masd reload",
    "masd mcp",
}


def test_every_command_that_reads_the_config_takes_config() -> None:
    taking = {
        where
        for where, cmd in commands(main)
        if any(isinstance(p, click.Option) and "--config" in p.opts for p in cmd.params)
    }
    assert taking == READS_CONFIG


def test_check_config_takes_config_and_the_positional_form(tmp_path: Path) -> None:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    runner = CliRunner()
    by_option = runner.invoke(main, ["check-config", "--config", str(setup.config)])
    positional = runner.invoke(main, ["check-config", str(setup.config)])
    assert by_option.exit_code == 0, by_option.output
    assert by_option.output == positional.output
    assert "help.example" in by_option.output
    other = tmp_path / "other.toml"
    both = runner.invoke(main, ["check-config", "--config", str(setup.config), str(other)])
    assert both.exit_code == 2
    assert "two files given" in both.output
    same = runner.invoke(main, ["check-config", "--config", str(setup.config), str(setup.config)])
    assert same.exit_code == 0, same.output
    missing = runner.invoke(main, ["check-config", "--config", str(other)])
    assert missing.exit_code == 1
    assert str(other) in missing.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "--log-level", "verbose"], "'verbose' is not one of"),
        (["doctor", "--messages", "0"], "0 is not in the range x>=1"),
        (["reload", "--timeout", "0"], "0.0 is not in the range x>0"),
        (["queue", "list", "--limit", "0"], "0 is not in the range x>=1"),
        (["case", "list", "--state", "shut"], "'shut' is not one of"),
    ],
)
def test_fixed_sets_and_ranges_are_validated(args: list[str], says: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert says in result.output, result.output


def test_log_level_takes_any_case(tmp_path: Path) -> None:
    # Parsed before serve runs: a config that does not exist fails after the level is taken.
    result = CliRunner().invoke(
        main, ["serve", "--log-level", "debug", "--config", str(tmp_path / "none.toml")]
    )
    assert result.exit_code == 1, result.output
    assert "is not one of" not in result.output
