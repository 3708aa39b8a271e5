"""Listening sockets: bound by masd, or inherited from systemd (sd_listen_fds(3)).

:func:`serve` is how every listener (LMTP, HTTP, policy) gets its socket: a
passed one is served as it is; otherwise the configured address is bound.
A unix socket is bound by :func:`bind_unix`, which sets its mode (0660)
*before* ``listen``: until then a connect is refused, so nobody ever reaches
the socket while its mode is still the umask's.  A stale socket file (left
by a process that did not clean up) is replaced; a path where another
process answers, or that is not a socket, is refused by name.

Inherited sockets: the service manager passes listening sockets as file
descriptors 3, 4, ... and describes them in three variables:
``LISTEN_PID`` (the process they are meant for; a child that inherited the
environment must ignore them), ``LISTEN_FDS`` (how many) and
``LISTEN_FDNAMES`` (a ``:``-separated name per descriptor, from
``FileDescriptorName=`` in the socket unit).  masd knows the names
``lmtp``, ``http`` and ``policy``; a socket so named replaces the listener
of the same name in ``[server]``.

Anything that is not what masd can serve is refused with
:class:`SocketActivationError`, naming the descriptor and the reason: an
unknown or repeated name, a count that does not match, a descriptor that is
not a listening stream socket.  A socket nobody would serve is a
misconfiguration better seen at start than as mail that never arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Final

from masd.config import Listen, TcpListen
from masd.core.errors import ConfigError, MasdError
from masd.edges.accept import AcceptServer

__all__ = [
    "LISTENER_NAMES",
    "SD_LISTEN_FDS_START",
    "SOCKET_MODE",
    "ListenError",
    "SocketActivationError",
    "adopt",
    "bind_unix",
    "inherited_sockets",
    "parse_listen_env",
    "serve",
]

#: The first passed descriptor (``SD_LISTEN_FDS_START``).
SD_LISTEN_FDS_START: Final = 3
#: Names a socket unit may give with ``FileDescriptorName=``.
LISTENER_NAMES: Final = ("lmtp", "http", "policy")
_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
#: Mode of the unix sockets masd binds: the MTA must be in masd's group.
SOCKET_MODE: Final = 0o660
#: How long a probe of an existing socket file waits for an answer.
PROBE_SECONDS: Final = 2.0


#: Connections the kernel holds before masd accepts them (asyncio's default is
#: 100): a burst of clients waits in the queue for its answer (at worst the
#: session cap's 421) instead of retrying dropped SYNs.
BACKLOG: Final = 1024


class ListenError(MasdError):
    """A listener cannot start (address in use, a non-socket at the path)."""

    code = "listen"


class SocketActivationError(ConfigError):
    """The sockets passed by the service manager cannot be served as they are."""

    code = "socket-activation"


def parse_listen_env(environ: Mapping[str, str], pid: int) -> tuple[tuple[int, str], ...]:
    """The ``(fd, name)`` pairs the environment passes to process ``pid``.

    Empty when ``LISTEN_PID`` is unset or names another process (the
    variables were inherited, not meant for us) or ``LISTEN_FDS`` is unset.
    """
    if "LISTEN_PID" not in environ or "LISTEN_FDS" not in environ:
        return ()
    listen_pid = environ["LISTEN_PID"]
    if not listen_pid.isdigit() or int(listen_pid) <= 0:
        raise SocketActivationError(f"{listen_pid!r} is not a process id", path="LISTEN_PID")
    if int(listen_pid) != pid:
        return ()
    count_text = environ["LISTEN_FDS"]
    if not count_text.isdigit():
        raise SocketActivationError(
            f"{count_text!r} is not a number of descriptors", path="LISTEN_FDS"
        )
    count = int(count_text)
    if count == 0:
        return ()
    if "LISTEN_FDNAMES" not in environ:
        raise SocketActivationError(
            f"missing: name each of the {count} sockets with FileDescriptorName= "
            f"({', '.join(LISTENER_NAMES)})",
            path="LISTEN_FDNAMES",
        )
    names = environ["LISTEN_FDNAMES"].split(":")
    if len(names) != count:
        raise SocketActivationError(
            f"{environ['LISTEN_FDNAMES']!r} has {len(names)} names for {count} sockets",
            path="LISTEN_FDNAMES",
        )
    pairs: list[tuple[int, str]] = []
    for index, name in enumerate(names):
        fd = SD_LISTEN_FDS_START + index
        if name not in LISTENER_NAMES:
            raise SocketActivationError(
                f"socket {fd} is named {name!r}; masd serves only "
                f"{', '.join(LISTENER_NAMES)} (set FileDescriptorName= in the socket unit)",
                path="LISTEN_FDNAMES",
            )
        if name in names[:index]:
            raise SocketActivationError(
                f"socket {fd} is named {name!r} like an earlier one; one socket per listener",
                path="LISTEN_FDNAMES",
            )
        pairs.append((fd, name))
    return tuple(pairs)


def adopt(fd: int, name: str) -> socket.socket:
    """Descriptor ``fd`` as a socket object, if it is a listening stream socket.

    The descriptor is made close-on-exec, as sd_listen_fds(3) does.
    """
    where = f"socket {fd} ({name})"
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise SocketActivationError(
            f"{where} is not open: {exc.strerror or exc}", path="LISTEN_FDS"
        ) from None
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketActivationError(f"{where} is not a socket", path="LISTEN_FDS")
    sock = socket.socket(fileno=fd)
    try:
        if sock.family not in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
            raise SocketActivationError(
                f"{where} is of family {sock.family.name}, not unix or IP", path="LISTEN_FDS"
            )
        if sock.type != socket.SOCK_STREAM:
            raise SocketActivationError(
                f"{where} is not a stream socket (use ListenStream=)", path="LISTEN_FDS"
            )
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise SocketActivationError(f"{where} is not listening", path="LISTEN_FDS")
    except BaseException:
        sock.detach()  # the descriptor stays the service manager's; do not close it here
        raise
    sock.set_inheritable(False)
    return sock


def inherited_sockets(
    environ: MutableMapping[str, str] | None = None, *, pid: int | None = None
) -> dict[str, socket.socket]:
    """The passed sockets by name, or ``{}`` when masd was not socket-activated.

    The three variables are removed from ``environ`` (``os.environ`` by
    default) so that no child process mistakes them for its own.
    """
    env = os.environ if environ is None else environ
    pairs = parse_listen_env(env, os.getpid() if pid is None else pid)
    for variable in _VARIABLES:
        env.pop(variable, None)
    adopted: dict[str, socket.socket] = {}
    try:
        for fd, name in pairs:
            adopted[name] = adopt(fd, name)
    except BaseException:
        for sock in adopted.values():
            with contextlib.suppress(OSError):
                sock.detach()
        raise
    return adopted


async def bind_unix(
    path: str | Path, *, mode: int = SOCKET_MODE, error: type[ListenError] = ListenError
) -> socket.socket:
    """A unix stream socket bound at ``path`` with ``mode``, not yet listening.

    The mode is set between ``bind`` and ``listen``: no client can connect
    while the file still has the umask's mode.  ``error`` names the refusal.
    """
    where = f"cannot listen on unix:{path}"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise error(f"{where}: it exists and is not a socket")
        if await _answers(str(path)):
            raise error(f"{where}: another process serves it")
        os.unlink(path)  # stale, left by a process that did not clean up
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, mode)
    except FileNotFoundError as exc:
        sock.close()
        folder = Path(path).parent
        raise error(
            f"{where}: the directory {folder} does not exist (masd.service creates /run/masd; "
            f'without systemd, create it for masd, or listen on TCP, e.g. "127.0.0.1:2424")'
        ) from exc
    except OSError as exc:
        sock.close()
        raise error(f"{where}: {exc.strerror or exc}") from exc
    return sock


async def _answers(path: str) -> bool:
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            _, writer = await asyncio.open_unix_connection(path)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def serve(
    factory: Callable[[], asyncio.BaseProtocol],
    listen: Listen | None,
    *,
    sock: socket.socket | None = None,
    error: type[ListenError] = ListenError,
) -> AcceptServer:
    """Serve ``factory`` on the inherited ``sock``, else on ``listen`` (bound here).

    An inherited socket keeps the owner and mode the service manager gave it.
    Connections are accepted by :class:`~masd.edges.accept.AcceptServer`
    (named after the listener: ``lmtp-listen`` errors, ``lmtp`` log lines).
    """
    name = error.code.removesuffix("-listen")
    if sock is not None:
        sock.listen(BACKLOG)
        return await _started(name, [sock], factory)
    if listen is None:
        raise error("no address configured")
    if isinstance(listen, TcpListen):
        try:
            bound = await _bind_tcp(listen.host, listen.port)
        except OSError as exc:
            raise error(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
    else:
        bound = [await bind_unix(listen.path, error=error)]
    try:
        for each in bound:
            each.listen(BACKLOG)
        return await _started(name, bound, factory)
    except OSError as exc:
        for each in bound:
            each.close()
        raise error(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
    except BaseException:
        for each in bound:
            each.close()
        raise


async def _started(
    name: str, sockets: list[socket.socket], factory: Callable[[], asyncio.BaseProtocol]
) -> AcceptServer:
    server = AcceptServer(name, sockets, factory)
    await server.start_serving()
    return server


async def _bind_tcp(host: str, port: int) -> list[socket.socket]:
    """A socket bound at each address ``host`` resolves to (as asyncio's
    ``create_server`` binds them: ``SO_REUSEADDR``, IPv6 sockets IPv6 only)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


class StreamListener:
    """A running stream listener that knows its open connections, so that
    :meth:`close` can end them (the policy and milter listeners)."""

    #: How long :meth:`close` waits for connections to end before cancelling them.
    close_timeout: float = 5.0

    def __init__(self) -> None:
        self.server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @contextlib.contextmanager
    def connection(self, writer: asyncio.StreamWriter) -> Iterator[None]:
        """Count the running task as an open connection while the block runs."""
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            yield
        finally:
            self._connections.pop(task, None)

    @property
    def addresses(self) -> list[object]:
        sockets = getattr(self.server, "sockets", None) or ()
        return [s.getsockname() for s in sockets]

    async def close(self) -> None:
        """Stop accepting; close every connection; wait (bounded) for them to end.

        An idle connection sees EOF and ends at once; the MTA reconnects (or
        applies its default action) on its next request.
        """
        if self.server is not None:
            self.server.close()
        tasks = list(self._connections)
        for writer in self._connections.values():
            writer.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.close_timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()
