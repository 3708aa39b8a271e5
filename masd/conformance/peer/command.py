"""``masd conformance peer mode|master``: the peer kit on the command line."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from masd.config.model import TcpListen
from masd.config.values import parse_listen

if TYPE_CHECKING:
    from masd.conformance.peer.load import PeerCheck
    from masd.conformance.peer.run import Kit

__all__ = ["peer"]

_CHECKS_HELP = "The checks folder (holding mode/ and master/). Default: masd's conformance/peer."


@click.group()
def peer() -> None:
    """Check a live mode endpoint or outside master against docs/protocol.md: the kit plays
    email's side and checks what the peer does (docs/protocol.md §19.1).
    """


def _common(command: click.decorators.FC) -> click.decorators.FC:
    options = [
        click.option("--target", required=True, metavar="URL", help="Where the peer listens."),
        click.option(
            "--token-file",
            required=True,
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="The peer's Bearer secret (its final newline is not part of it).",
        ),
        click.option(
            "--signing-secret-file",
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            default=None,
            help="Sign the kit's requests with these whsec_ secrets (docs/protocol.md §9.8).",
        ),
        click.option(
            "--wait",
            type=click.FloatRange(min=0.1),
            default=30.0,
            show_default=True,
            help="Seconds a check waits for the peer's posts.",
        ),
        click.option("--check", "names", multiple=True, metavar="NAME", help="Only this check."),
        click.option(
            "--checks",
            "checks_dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help=_CHECKS_HELP,
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True)
class _Common:
    target: str
    token_file: Path
    signing_secret_file: Path | None
    wait: float
    names: tuple[str, ...]
    checks_dir: Path | None


@peer.command("mode")
@_common
@click.option("--mode", default="callback", show_default=True, help="The mode requested.")
@click.option(
    "--detail",
    "details",
    multiple=True,
    metavar="NAME=VALUE",
    help="A detail the kit's handoff.request carries (repeatable), e.g. phone=+1 555 0100.",
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    help="Where the kit listens for the statuses (the status_url it sends).",
)
def peer_mode(mode: str, details: tuple[str, ...], listen: str, **common: Any) -> None:
    """Stand in for email as master against a mode endpoint at --target.

    The kit sends handoff.request, handoff.update and handoff.cancel, receives
    the statuses at its own status_url, and prints PASS or FAIL per check, then
    "N passed, M failed". Exit status 0 only when every check passes.
    """
    pairs = {}
    for item in details:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--detail")
        pairs[name.strip().lower()] = value.strip()
    raise SystemExit(_run("mode", listen, _Common(**common), mode=mode, details=pairs))


@peer.command("master")
@_common
@click.option("--type", "resource_type", default="case", show_default=True, help="Slave type.")
@click.option("--domain", default="help.example", show_default=True, help="The mail domain.")
@click.option(
    "--listen",
    default="127.0.0.1:8025",
    show_default=True,
    help="Where the kit listens: the master must post to http://LISTEN/mas/v0.1/messages.",
)
def peer_master(resource_type: str, domain: str, listen: str, **common: Any) -> None:
    """Stand in for email as slave against an outside master at --target.

    The kit sends case.intake and case.message, receives the master's
    case.assign and mail.send at --listen, and prints PASS or FAIL per check,
    then "N passed, M failed". Exit status 0 only when every check passes.
    """
    extra = {"resource_type": resource_type, "domain": domain}
    raise SystemExit(_run("master", listen, _Common(**common), **extra))


def _run(role: str, listen: str, common: _Common, **extra: Any) -> int:
    """0 every check passed, 1 one failed, 2 nothing could run."""
    from masd._resources import conformance_dir
    from masd.conformance.peer.load import CheckError, load_checks
    from masd.conformance.peer.run import Kit, KitOptions, read_signing, read_token

    try:
        where = parse_listen(listen, base_dir=Path.cwd())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    if not isinstance(where, TcpListen):
        raise click.BadParameter("not a TCP address", param_hint="--listen")
    folder = common.checks_dir or conformance_dir() / "peer"
    try:
        checks = load_checks(folder, role)
        token = read_token(common.token_file)
        keys = read_signing(common.signing_secret_file)
    except (CheckError, ValueError, OSError) as exc:
        click.echo(f"masd: {exc}", err=True)
        return 2
    unknown = [n for n in common.names if n not in {c.name for c in checks}]
    if unknown:
        click.echo(f"masd: no check {unknown[0]!r} in {folder / role}", err=True)
        return 2
    if common.names:
        checks = [c for c in checks if c.name in common.names]
    options = KitOptions(
        role=role,
        target=common.target,
        token=token,
        wait=common.wait,
        listen=(where.host, where.port),
        signing_keys=keys,
        **extra,
    )
    return asyncio.run(_play(Kit(options), checks))


async def _play(kit: Kit, checks: list[PeerCheck]) -> int:
    try:
        await kit.start()
    except OSError as exc:
        host, port = kit.options.listen
        click.echo(f"masd: --listen {host}:{port}: {exc.strerror or exc}", err=True)
        return 2
    try:
        return await kit.run(checks, sys.stdout)
    finally:
        await kit.close()
