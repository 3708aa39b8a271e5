"""Bounces read in a process of their own, bounded (docs/protocol.md §22).

A bounce address is no secret: every acknowledgement masd sends carries one.
Reading what arrives there costs little for a report (RFC 3464) but seconds
for hostile text in the detectors of the other forms (flufl.bounce runs its
patterns over every line).  So, as Postfix and Mailman do, the reading runs
apart from the listeners:

- in one child process (``python -m masd.edges.bounce_reader``, at a lower
  priority): masd's event loop and its interpreter lock are never held by it;
- on a bounded prefix (:data:`masd.core.dsn.READ_BYTES`, and
  :data:`~masd.core.dsn.HEURISTIC_BYTES` for the detectors);
- within :data:`BUDGET_SECONDS`: past it the child is killed (the next
  mail starts another) and the mail is read as no bounce, so it is recorded
  as automated mail on its case and never lost;
- one mail at a time, at most :data:`MAX_WAITING` waiting, each for at most
  :data:`WAIT_SECONDS`; past either :class:`Busy` (LMTP ``451 4.3.2``) and
  the sender tries again later.

The LMTP edge does not read a mail it has recorded already.  Frames on the
pipe: an 8-octet big-endian length, then the bytes (the mail one way, the
report as JSON or ``null`` the other).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import sys
from collections.abc import Sequence
from typing import BinaryIO, Final

from masd.core.dsn import BounceReport, read_bounce
from masd.core.errors import MasdError
from masd.metrics import Metrics
from masd.service import bounce_mail

log = logging.getLogger("masd.lmtp")

#: Longest the child may take over one mail.
BUDGET_SECONDS: Final = 5.0
#: Mails waiting for the child at most; one more is answered :class:`Busy`.
MAX_WAITING: Final = 16
#: Longest a mail waits for its turn before it is answered :class:`Busy`.
WAIT_SECONDS: Final = 30.0
#: Longest the child may take to start.
START_SECONDS: Final = 30.0
#: The child's nice increment: it yields the processor to masd's listeners.
NICE: Final = 10
METRIC: Final = "masd_bounce_reads_total"
_LENGTH: Final = struct.Struct(">Q")
#: Longest report frame read back (a report is a few hundred octets).
_MAX_REPLY: Final = 64 * 1024


class Busy(MasdError):
    """More mails wait for the bounce reader than it takes (LMTP ``451 4.3.2``)."""

    code = "bounce-reader-busy"


class BounceReader:
    """The parent's side: :meth:`read` a mail in the child, :meth:`close` it."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        budget: float = BUDGET_SECONDS,
        max_waiting: int = MAX_WAITING,
        wait: float = WAIT_SECONDS,
        command: Sequence[str] = (),
    ) -> None:
        self._metrics = metrics or Metrics()
        #: The child's command line: this module, unless another reader is given.
        self._command = tuple(command) or (sys.executable, "-m", __name__)
        self._budget = budget
        self._max_waiting = max_waiting
        self._wait = wait
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._child: asyncio.subprocess.Process | None = None

    async def read(self, raw: bytes) -> bounce_mail.Read:
        """What the mail reports; :class:`Busy` when it cannot have its turn soon."""
        await self._take_turn()
        try:
            child = await self._started()  # its start is not the mail's to pay for
            async with asyncio.timeout(self._budget):
                report = await self._ask(child, raw)
        except TimeoutError:
            await self._kill()
            log.warning(
                "bounce not read within %.1f s (%d octets): recorded as no bounce",
                self._budget,
                len(raw),
            )
            self._metrics.inc(METRIC, outcome=bounce_mail.OVER_BUDGET)
            return bounce_mail.Read(None, unread=bounce_mail.OVER_BUDGET)
        finally:
            self._turn.release()
        self._metrics.inc(METRIC, outcome="bounce" if report else "no-bounce")
        return bounce_mail.Read(report)

    async def _take_turn(self) -> None:
        if self._waiting >= self._max_waiting:
            self._metrics.inc(METRIC, outcome="busy")
            raise Busy(f"{self._waiting} mails wait to be read as bounces; try again later")
        self._waiting += 1
        try:
            async with asyncio.timeout(self._wait):
                await self._turn.acquire()
        except TimeoutError:
            self._metrics.inc(METRIC, outcome="busy")
            raise Busy(
                f"the bounce reader was busy for {self._wait:g} s; try again later"
            ) from None
        finally:
            self._waiting -= 1

    async def _ask(
        self, child: asyncio.subprocess.Process | None, raw: bytes
    ) -> BounceReport | None:
        if child is None:  # it could not be started: read on a thread, within the budget
            return await asyncio.to_thread(read_bounce, raw)
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            child.stdin.write(_LENGTH.pack(len(raw)) + raw)
            await child.stdin.drain()
            (length,) = _LENGTH.unpack(await child.stdout.readexactly(_LENGTH.size))
            if length > _MAX_REPLY:
                raise ValueError(f"a report frame of {length} octets")
            data = json.loads(await child.stdout.readexactly(length))
            return None if data is None else BounceReport.from_json(data)
        except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
            # The child died or wrote nonsense: this mail is read on a thread, within
            # the same budget; the next one starts another child.
            log.warning("bounce reader failed (%s); reading this mail in masd", exc)
            await self._kill()
            return await asyncio.to_thread(read_bounce, raw)

    async def _started(self) -> asyncio.subprocess.Process | None:
        """The child, started if need be (it says ready once it has imported its reader);
        None when it cannot be started."""
        if self._child is not None and self._child.returncode is None:
            return self._child
        try:
            self._child = await asyncio.create_subprocess_exec(
                *self._command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert self._child.stdout is not None
            async with asyncio.timeout(START_SECONDS):
                await self._child.stdout.readexactly(_LENGTH.size)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("bounce reader cannot start (%s); reading bounces in masd", exc)
            await self._kill()
            return None
        return self._child

    async def _kill(self) -> None:
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()

    async def close(self) -> None:
        """End the child (it also ends by itself when masd's end of the pipe closes)."""
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return
        assert child.stdin is not None
        child.stdin.close()
        try:
            async with asyncio.timeout(2.0):
                await child.wait()
        except TimeoutError:
            await self._kill_now(child)

    @staticmethod
    async def _kill_now(child: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The child: say ready (an empty frame), then read mails and write their reports
    until the pipe closes."""
    stdout.write(_LENGTH.pack(0))
    stdout.flush()
    while True:
        head = stdin.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return
        (length,) = _LENGTH.unpack(head)
        raw = stdin.read(length)
        try:
            found = read_bounce(raw)
        except Exception:  # noqa: BLE001 - a mail that trips the reader is no bounce
            found = None
        reply = json.dumps(None if found is None else found.to_json()).encode()
        stdout.write(_LENGTH.pack(len(reply)) + reply)
        stdout.flush()


def main() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICE)
    logging.disable(logging.CRITICAL)  # flufl.bounce logs every detector it runs
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        _serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
