"""``masd mcp``: masd's MCP tools over stdio, for an agent on the host (docs/protocol.md §23).

The caller is the secret in ``--token-file``, read once at start.  Reads go to the store
beside the running masd (as ``masd case show`` does); contract messages to the running
masd's ``POST /mas/v0.1/messages`` (so its outbox sends at once), or, when none answers,
through the same path on the store itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

from masd.cli.common import CONFIG, load

if TYPE_CHECKING:
    from masd.config import Config

#: Exit status when the token file cannot be used or its secret names no caller.
NO_CALLER: Final = 3
_SECRET: Final = re.compile(r"[!-~]+")


def _secret(path: Path) -> str:
    """The secret in ``path`` (one line of printable ASCII), or exit :data:`NO_CALLER`."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        click.echo(f"masd: --token-file {path}: cannot read it ({why})", err=True)
        raise SystemExit(NO_CALLER) from None
    if not _SECRET.fullmatch(text):
        click.echo(
            f"masd: --token-file {path}: not one secret of printable ASCII without spaces",
            err=True,
        )
        raise SystemExit(NO_CALLER)
    return text


@click.command("mcp")
@CONFIG
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The file holding the caller's secret: the admin's, a master's or a mode endpoint's.",
)
def mcp(config_file: Path, token_file: Path) -> None:
    """Serve masd's MCP tools over stdio, as the caller whose secret --token-file holds.

    Exit status 3 when the token file is missing, unreadable or not one secret, or its
    secret is no caller's; 1 on a configuration or store error.
    """
    secret = _secret(token_file)
    config = load(config_file)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(config, secret, token_file))


async def _serve(config: Config, secret: str, token_file: Path) -> None:
    import secrets

    import httpx
    from mcp.server.stdio import stdio_server

    from masd.cli.admin_client import base_url
    from masd.clock import Clock
    from masd.config import UnixListen
    from masd.core.errors import MasdError
    from masd.edges.context import EdgeContext
    from masd.edges.http.shared import HttpRefusal, Served
    from masd.edges.mcp_acts import InProcess, OverHttp
    from masd.edges.mcp_caller import caller_of
    from masd.edges.mcp_server import McpEdge, Seat
    from masd.logs import keep_secrets
    from masd.read.feed import FeedWatch
    from masd.service import Runtime
    from masd.store import open_store

    keep_secrets(config)
    rt = Runtime(config, lambda: secrets.token_hex(16))
    try:
        caller = caller_of(rt, secret)
    except HttpRefusal as exc:
        click.echo(f"masd: --token-file {token_file}: {exc.detail}", err=True)
        raise SystemExit(NO_CALLER) from None
    try:
        store = await asyncio.to_thread(open_store, config.server.database, migrate=False)
    except MasdError as exc:
        click.echo(f"masd: {exc}", err=True)
        raise SystemExit(1) from None
    feed = FeedWatch()
    try:
        edge = Served.of(EdgeContext(rt, store, Clock(), listener=feed), feed)
        url, _ = base_url(config)
        listen = config.server.http
        uds = listen.path if isinstance(listen, UnixListen) else None
        transport = None if uds is None else httpx.AsyncHTTPTransport(uds=str(uds))
        door = OverHttp(url, transport, InProcess(edge))
        server = McpEdge(edge, door, Seat(caller, secret)).server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        feed.close()
        await asyncio.to_thread(store.close)
