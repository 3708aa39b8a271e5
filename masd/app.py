"""Wiring and lifecycle: one process, one asyncio loop, every edge on it.

Start order: store (migrations applied), then the outbox and the deadline
timer (so work left by a previous run resumes), then the LMTP and HTTP
listeners and, when configured, the policy and milter listeners
(``server.policy``, ``server.milter``); ``READY=1`` goes to systemd when they
all listen.  ``SIGHUP`` (:meth:`App.reload`) re-reads the configuration
files and swaps the running configuration when they are valid.  Stop order
(SIGTERM): the policy and milter listeners first, then stop accepting, let
in-flight deliveries and requests finish, let in-flight sends finish, close
the store; exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import secrets
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from masd.clock import Clock
from masd.config import Config, ConfigErrors, Listen, load_config
from masd.config.reload import restart_needed
from masd.core.errors import MasdError
from masd.edges import descriptors
from masd.edges.context import EdgeContext
from masd.edges.http import HttpEdge, HttpLimits, HttpServer, start_http
from masd.edges.lmtp import LmtpHandler, start_lmtp
from masd.edges.milter import MilterServer, start_milter
from masd.edges.outbox import Outbox
from masd.edges.policy import PolicyHandler, PolicyServer, start_policy
from masd.edges.sockets import SocketActivationError, inherited_sockets
from masd.edges.timer import DeadlineTimer
from masd.logs import keep_secrets
from masd.metrics import Metrics
from masd.read.feed import FeedWatch
from masd.service import ALL_WAKES, PURGE_BATCH, Runtime, Wakes, expired, purge, reloading, retire
from masd.store import StoreError, StoreHandle, open_store

if TYPE_CHECKING:
    from masd.edges.mcp_http import McpServer

log = logging.getLogger("masd.app")

#: How often expired rows are purged (service.purge).
HOUSEKEEPING_SECONDS = 3600.0

#: How long SIGTERM waits for in-flight deliveries before closing anyway.
DRAIN_SECONDS = 30.0

#: Where several hosts share the store, how often this host looks for what the others
#: committed (rows queued, deadlines written, leases of a host that died): polling with
#: this bound, beside the wakes of its own commits (see :meth:`App._other_hosts`).
HOSTS_POLL_SECONDS = 1.0


async def _start_mcp(listen: Listen, http: HttpEdge, limits: HttpLimits) -> McpServer:
    """The MCP listener (``server.mcp``), with the SDK imported only when it is on."""
    try:
        from masd.edges.mcp_http import start_mcp
    except ImportError as exc:
        raise MasdError(
            f"server.mcp = {listen} needs the mcp package ({exc.name} is missing): "
            "pip install 'masd[mcp]'",
            code="mcp-listen",
        ) from exc
    return await start_mcp(listen, http.served, limits)


def sd_notify(state: str) -> bool:
    """Tell systemd ``state`` (e.g. ``READY=1``) if it asked (``$NOTIFY_SOCKET``)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        # A notification is advice to the service manager: failing to give
        # it must never stop masd from starting or from stopping cleanly.
        log.warning("sd_notify %s to %s failed: %s", state, address, exc)
        return False
    return True


def new_id() -> str:
    """A random id of 128 bits (docs/protocol.md §2: handoff ids "cannot be guessed")."""
    return secrets.token_hex(16)


class Wakeup:
    """Wakes the outbox and the deadline timer for what a commit gave them to do.

    The app's :class:`~masd.service.CommitListener`: the edges tell it each
    committed job's :class:`~masd.service.Wakes`; the outbox is woken only
    when rows were queued, the timer only for a deadline sooner than the one
    it sleeps until.  The event feed hears of every commit.
    """

    def __init__(self) -> None:
        self.outbox: Outbox | None = None
        self.timer: DeadlineTimer | None = None
        self.feed = FeedWatch()

    def committed(self, wakes: Wakes) -> None:
        self.feed.poke()
        if wakes.erased and self.outbox is not None:
            self.outbox.abandon(wakes.erased)
        if wakes.outbox and self.outbox is not None:
            self.outbox.wake(wakes.queues, wakes.rows)
        if wakes.deadline is not None and self.timer is not None:
            self.timer.wake_for(wakes.deadline)


@dataclass
class Listening:
    lmtp: asyncio.AbstractServer
    http: HttpServer
    policy: PolicyServer | None = None  # server.policy (Postfix policy delegation)
    milter: MilterServer | None = None  # server.milter (docs/protocol.md §17)
    mcp: McpServer | None = None  # server.mcp (docs/protocol.md §23)


class App:
    """masd, running: build with a config, ``await start()``, ``await stop()``."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        sockets: Mapping[str, socket.socket] | None = None,
        pid_file: Path | None = None,
    ) -> None:
        """``sockets``: listening sockets by listener name, served instead of
        binding the configured address; by default those systemd passed
        (``LISTEN_FDS``, see :mod:`masd.edges.sockets`).  ``pid_file``: where
        :meth:`run` writes its pid, and each reload its outcome
        (:mod:`masd.service.reloading`)."""
        self.config = config
        self._pid_file = pid_file
        self._reload_lock = asyncio.Lock()
        self.reloads = 0
        self._sockets = sockets
        self.clock = clock or Clock()
        self.metrics = Metrics()
        self.rt = Runtime(config, new_id)
        keep_secrets(config)  # no log line shows them from now on
        self.store: StoreHandle | None = None
        self.listening: Listening | None = None
        self._stopped = asyncio.Event()
        self.wakeup = Wakeup()
        self._poller: asyncio.Future[None] | None = None

    async def start(self) -> Listening:
        inherited = dict(self._sockets) if self._sockets is not None else inherited_sockets()
        served = {"lmtp", "http", "policy", "milter"}  # the listeners started below
        unserved = sorted(set(inherited) - served)
        if unserved:
            raise SocketActivationError(
                f"a socket named {unserved[0]!r} was passed, but masd runs no such listener",
                path="LISTEN_FDNAMES",
            )
        self._descriptors(inherited)
        server = self.config.server
        self.store = await asyncio.to_thread(
            open_store, server.database, claim_timeout=server.claim_timeout
        )
        ctx = EdgeContext(self.rt, self.store, self.clock, self.metrics, self.wakeup)
        self.outbox = Outbox(ctx)
        self.timer = DeadlineTimer(ctx)
        self.wakeup.outbox, self.wakeup.timer = self.outbox, self.timer
        self.outbox.start()
        self.timer.start()
        self._housekeeper = asyncio.ensure_future(self._housekeeping())
        if getattr(self.store, "claim_seconds", None) is not None:
            self._poller = asyncio.ensure_future(self._other_hosts())
        self.listening = await self._listen(ctx, inherited)
        http, policy, milter = self.listening.http, self.listening.policy, self.listening.milter
        self._bound_status_url()
        log.info(
            "ready lmtp=%s http=%s policy=%s milter=%s database=%s",
            _where(self.listening.lmtp),
            http.addresses,
            policy.addresses if policy is not None else "off",
            milter.addresses if milter is not None else "off",
            server.database,
        )
        sd_notify("READY=1")
        return self.listening

    def _bound_status_url(self) -> None:
        """A public_url defaulted from "host:0": statuses go to the port bound."""
        assert self.listening is not None
        http = self.listening.http
        bound = http.addresses[0] if http.addresses else None
        if urlsplit(self.config.server.public_url).port == 0 and isinstance(bound, tuple):
            host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            self.rt.status_url = f"http://{host}:{bound[1]}/mas/v0.1/messages"

    async def reload(self) -> reloading.ReloadOutcome:
        """Re-read the configuration files; a valid result replaces the running one.

        Connections stay open; each input from now on reads the new
        configuration.  An invalid result, or one that changes what is bound
        at start (:data:`~masd.config.reload.RESTART_KEYS`), is refused and
        logged, and the running configuration kept.
        """
        async with self._reload_lock:
            outcome = await self._reload()
            self.reloads += 1
            if self._pid_file is not None:
                reloading.write_status(self._pid_file, self.reloads, outcome)
        return outcome

    async def _reload(self) -> reloading.ReloadOutcome:
        source = self.config.source
        try:
            new = await asyncio.to_thread(load_config, source)
        except ConfigErrors as exc:
            refused = tuple(str(error) for error in exc.errors)
        else:
            refused = tuple(restart_needed(self.config, new))
        if refused:
            log.error(
                "reload refused, the running configuration is kept: %s: %s",
                source,
                "; ".join(refused),
            )
            return reloading.ReloadOutcome(False, (f"reload refused: {source}", *refused))
        for warning in new.warnings:
            log.warning("reload: %s", warning)
        keep_secrets(new)  # a secret added by the reload is redacted too
        self.rt.replace_config(new)
        self.config = new
        if self.listening is not None:
            self._bound_status_url()
        domains = ", ".join(sorted(new.domains))
        log.info("reloaded %s: domains %s", source, domains)
        return reloading.ReloadOutcome(True, (f"reloaded {source}: domains {domains}",))

    def _descriptors(self, inherited: Mapping[str, socket.socket]) -> None:
        """Enough open files for the caps of the listeners about to start."""
        server = self.config.server
        run = ["lmtp", "http"]
        listeners = (("policy", server.policy), ("milter", server.milter), ("mcp", server.mcp))
        run += [n for n, on in listeners if on]
        wanted = descriptors.need(server, {*run, *inherited})
        before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = descriptors.ensure(wanted)
        if soft != before:
            log.info("open files: soft limit raised from %d to %d (%s)", before, soft, wanted)

    async def _listen(self, ctx: EdgeContext, inherited: Mapping[str, socket.socket]) -> Listening:
        """Start every listener; if one cannot start, close those already started."""
        server = self.config.server
        async with contextlib.AsyncExitStack() as started:
            self.lmtp_handler = LmtpHandler(ctx)
            lmtp = await start_lmtp(
                server.lmtp,
                self.lmtp_handler,
                hostname=server.hostname,
                max_message_bytes=server.max_message_bytes,
                sock=inherited.get("lmtp"),
                max_sessions=server.max_lmtp_sessions,
            )
            started.callback(lmtp.close)
            self.http_edge = HttpEdge(ctx, feed=self.wakeup.feed)
            limits = HttpLimits(max_connections=server.max_http_connections)
            http = await start_http(
                server.http, self.http_edge, sock=inherited.get("http"), limits=limits
            )
            started.push_async_callback(http.close)
            policy: PolicyServer | None = None
            if server.policy is not None or "policy" in inherited:
                policy = await start_policy(
                    server.policy,
                    PolicyHandler(ctx),
                    sock=inherited.get("policy"),
                    max_connections=server.max_policy_connections,
                )
                started.push_async_callback(policy.close)
            milter: MilterServer | None = None
            if server.milter is not None or "milter" in inherited:
                milter = await start_milter(
                    server.milter,
                    MilterServer(ctx),
                    sock=inherited.get("milter"),
                    max_connections=server.max_milter_connections,
                )
                started.push_async_callback(milter.close)
            mcp = None
            if server.mcp is not None:
                mcp = await _start_mcp(server.mcp, self.http_edge, limits)
            started.pop_all()  # every listener is up: they stay open
        return Listening(lmtp, http, policy, milter, mcp)

    async def stop(self) -> None:
        """Stop accepting, finish what is in flight, close the store."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        sd_notify("STOPPING=1")
        await self._close()
        log.info("stopped")

    async def _close(self) -> None:
        if self.listening is not None:
            if self.listening.policy is not None:
                await self.listening.policy.close()
            if self.listening.milter is not None:
                await self.listening.milter.close()
            if self.listening.mcp is not None:
                await self.listening.mcp.close()
            self.listening.lmtp.close()
            await self._drain_lmtp()
            await self.lmtp_handler.close()
            await self.listening.http.close()
        if self.store is not None:
            self._housekeeper.cancel()
            if self._poller is not None:
                self._poller.cancel()
            await asyncio.gather(self._housekeeper, self._poller or _done(), return_exceptions=True)
            await self.timer.stop()
            await self.outbox.stop()
            await asyncio.to_thread(self.store.close)

    async def _other_hosts(self) -> None:
        """Several hosts, one store: wake the outbox and the deadline timer every
        :data:`HOSTS_POLL_SECONDS`, for what other hosts committed.

        Polling, not ``LISTEN``/``NOTIFY``: a notification is lost with the session that
        listens for it (a failover ends every session), so a host would need the poll
        anyway to stay right; with it, a host learns of another's commit within the bound
        and a database that fails over needs nothing more.  The event feed polls alike
        (:data:`masd.read.feed.POLL_SECONDS`).
        """
        while True:
            await asyncio.sleep(HOSTS_POLL_SECONDS)
            self.wakeup.committed(ALL_WAKES)
            await self.outbox.adopt()  # the rows of a host that died mid-send

    async def _housekeeping(self) -> None:
        """Purge expired dedupe, idempotency, delivered outbox and send log rows, and
        the cases past their type's ``retain``, hourly."""
        while True:
            try:
                removed = await self.purge()
                if any(removed.values()):
                    log.info("purged %s", " ".join(f"{k}={v}" for k, v in removed.items()))
            except StoreError as exc:  # the store's own fault, named (a full disk, no files)
                log.warning("housekeeping skipped: %s; trying again later", exc)
            except Exception:
                log.exception("housekeeping failed; trying again later")
            await asyncio.sleep(HOUSEKEEPING_SECONDS)

    async def purge(self) -> dict[str, int]:
        """Everything expired, one bounded store job after another (service.purge)."""
        assert self.store is not None
        now = self.clock.now()
        total: dict[str, int] = {}
        while True:
            removed = await self.store.write(functools.partial(purge, now=now))
            for table, n in removed.items():
                total[table] = total.get(table, 0) + n
            if max(removed.values()) < PURGE_BATCH:
                break
        return self._add(total, await self.retire(now))

    async def retire(self, now: float) -> dict[str, int]:
        """Cases past their type's ``retain`` removed, a bounded batch per store job:
        found by a read, then each checked again as the write removes it."""
        assert self.store is not None
        total: dict[str, int] = {}
        while found := await self.store.read(functools.partial(expired, self.rt, now=now)):
            removed = await self.store.write(functools.partial(retire, found=found))
            self._add(total, {f"retired_{k}": n for k, n in removed.items()})
            if removed["cases"] == 0:
                break  # what was found is no longer expired (a mail came): next time
        return total

    @staticmethod
    def _add(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
        for table, n in more.items():
            total[table] = total.get(table, 0) + n
        return total

    async def _drain_lmtp(self) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + DRAIN_SECONDS
        while getattr(self.lmtp_handler, "in_flight", 0) and loop.time() < until:
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        """Start, serve until SIGTERM or SIGINT (reloading on SIGHUP), stop."""
        if self._pid_file is not None:
            reloading.write_pid(self._pid_file)
        try:
            await self._serve()
        finally:
            if self._pid_file is not None:
                reloading.remove_pid(self._pid_file)

    async def _serve(self) -> None:
        try:
            await self.start()
        except BaseException:
            # A listener could not start (a port in use): close what had
            # started (the outbox's HTTP client, the store) before reporting.
            await self._close()
            raise
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[reloading.ReloadOutcome]] = set()

        def hangup() -> None:
            log.info("SIGHUP received; reloading %s", self.config.source)
            task = asyncio.ensure_future(self.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, hangup)
        try:
            await stop.wait()
            log.info("signal received; stopping")
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            await asyncio.gather(*reloads, return_exceptions=True)
            await self.stop()


async def _done() -> None:
    return None


def _where(server: asyncio.AbstractServer) -> str:
    sockets = getattr(server, "sockets", None) or ()
    names = [s.getsockname() for s in sockets]
    return ", ".join(str(n) for n in names)
