"""A :class:`~masd.testing.tcp_proxy.TcpProxy` in a process of its own.

In the process that also runs a load generator, the proxy's thread waits for that
process's interpreter lock before it forwards a packet (up to the interpreter's switch
interval, 5 ms, while the other thread runs): the packets are held longer than the delay
asked, and more so the busier the load.  A benchmark that wants the delay it asked for runs
the proxy here instead: ``with ProxyProcess(("127.0.0.1", port), delay=0.001) as proxy:``,
with :attr:`port`, :attr:`delay` and :attr:`round_trips` as the proxy's.

The child is ``python -m masd.testing.proxy_process HOST PORT DELAY``: it prints
``port N`` once it listens, answers each ``trips`` line on its standard input with the
round trips so far, and stops at the end of its input (its parent gone or done).
"""

from __future__ import annotations

import subprocess
import sys
from typing import IO

from masd.testing.tcp_proxy import TcpProxy

__all__ = ["ProxyProcess"]


class ProxyProcessError(Exception):
    """The proxy's process did not start or stopped answering."""


class ProxyProcess:
    """Forward a port on loopback to ``target`` from a child process; see the module."""

    def __init__(self, target: tuple[str, int], *, delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> ProxyProcess:
        host, port = self.target
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "masd.testing.proxy_process", host, str(port), repr(self.delay)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self._line()
        if not first.startswith("port "):
            self.stop()
            raise ProxyProcessError(f"the proxy's process said {first!r}, not its port")
        self.port = int(first.split()[1])
        return self

    def _line(self) -> str:
        assert self._proc is not None
        out: IO[str] | None = self._proc.stdout
        line = out.readline() if out is not None else ""
        if not line:
            raise ProxyProcessError(f"the proxy's process ended (exit {self._proc.poll()})")
        return line.strip()

    @property
    def round_trips(self) -> int:
        if self._proc is None or self._proc.stdin is None:
            raise ProxyProcessError("the proxy's process is not running")
        self._proc.stdin.write("trips\n")
        self._proc.stdin.flush()
        return int(self._line())

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    host, port, delay = argv[0], int(argv[1]), float(argv[2])
    with TcpProxy((host, port), delay=delay) as proxy:
        print(f"port {proxy.port}", flush=True)
        for line in sys.stdin:
            if line.strip() == "trips":
                print(proxy.round_trips, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
