"""The outbox sender: contract messages over HTTP and mail over SMTP (PROFILE §4, §7).

Rows are queued by the service inside the transaction that caused them;
this loop delivers them.  The head of each queue (one case and one peer) is
sent at most once at a time, so "Messages about one case to one peer are
delivered in order"; queues go in parallel up to :data:`MAX_IN_FLIGHT`.
Every outcome is written back in its own store job: 2xx done; 3xx/4xx
failed for good (redirects are never followed); 5xx, timeouts and
connection errors retried by :func:`masd.service.outbox_retry` with the same
``id`` until ``server.retry_for``.  A send cut short by :meth:`Outbox.stop`
leaves its row pending, so it goes out again after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from sqlite_utils import Database

from masd import service
from masd.clock import Clock
from masd.edges.mailer import MailTransport, OutboundMail
from masd.edges.smtp import SmtpTransport
from masd.metrics import Metrics
from masd.service import OutboxItem, Runtime
from masd.store import Store

log = logging.getLogger("masd.outbox")

MAX_IN_FLIGHT: Final = 64
HTTP_TIMEOUT: Final = 10.0
SMTP_TIMEOUT: Final = 30.0
STOP_GRACE: Final = 10.0
#: How long the loop rests after the store failed it, before looking again.
STORE_PAUSE: Final = 1.0
#: Bytes of a refusal's body kept for the thread (PROFILE §7 "recorded ... with the detail").
BODY_KEEP: Final = 300
#: Counter of wakes from outside (a commit queued rows): each costs the loop a read.
WAKES_METRIC: Final = "masd_outbox_wakes_total"
_MESSAGE_ID = re.compile(r"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class _Result:
    """What one attempt came to: done, failed (for good) or retry."""

    result: str
    detail: str = ""


class Outbox:
    """Delivers pending outbox rows; see the module docstring."""

    def __init__(
        self,
        rt: Runtime,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        *,
        on_commit: Callable[[], None] | None = None,
        mail: MailTransport | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        http_timeout: float = HTTP_TIMEOUT,
        smtp_timeout: float = SMTP_TIMEOUT,
        stop_grace: float = STOP_GRACE,
    ) -> None:
        self._rt = rt
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._on_commit = on_commit
        self._max = max_in_flight
        self._http_timeout = http_timeout
        server = rt.config.server
        self._mailer: MailTransport = mail or SmtpTransport(
            server.smtp_relay,
            hostname=server.hostname,
            keys={d: c.dkim_keys for d, c in rt.config.domains.items()},
            timeout=smtp_timeout,
            clock=clock,
        )
        self._stop_grace = stop_grace
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._client: aiohttp.ClientSession | None = None
        self._in_flight: dict[str, asyncio.Task[None]] = {}  # queue -> its send
        metrics.inc(WAKES_METRIC, 0.0)  # on /metrics from the start

    def start(self) -> None:
        """Start the loop (on the running event loop)."""
        if self._task is not None:
            raise RuntimeError("Outbox already started")
        # aiohttp's client, not httpx: at 16 and 64 concurrent posts httpx
        # spent 2-6 ms of CPU per request against aiohttp's 0.1-0.2 ms
        # (docs/performance.md, "HTTP clients"), and the sender is on the
        # same loop as the listeners.  HTTP/1.1 keep-alive, one pool.
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=self._http_timeout),
            trust_env=False,  # no proxy from the environment between masd and its peers
            auto_decompress=False,
        )
        self._task = asyncio.create_task(self._run(), name="masd-outbox")

    def wake(self) -> None:
        """Look at the outbox now (new rows may have been committed)."""
        self._metrics.inc(WAKES_METRIC)
        self._wake.set()

    async def stop(self) -> None:
        """Take nothing new, let in-flight sends finish (at most ``stop_grace`` s), close."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        sends = list(self._in_flight.values())
        if sends:
            _, late = await asyncio.wait(sends, timeout=self._stop_grace)
            for task in late:
                task.cancel()  # its row stays pending: sent again after a restart
            await asyncio.gather(*late, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
        await self._mailer.close()

    # -- the loop ---------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()  # before reading: a wake from now on is not lost
            now = self._clock.now()
            free = self._max - len(self._in_flight)
            busy = frozenset(self._in_flight)
            try:
                items, next_at = await self._store.read(
                    functools.partial(_look, now=now, free=free, busy=busy)
                )
            except Exception as exc:  # noqa: BLE001 - the store failing must not end the loop
                log.warning("outbox read failed error=%s", exc)
                await _pause(self._wake, STORE_PAUSE)
                continue
            if self._stopping:
                break
            for item in items:
                self._in_flight[item.queue] = asyncio.create_task(
                    self._attempt(item), name=f"masd-outbox-{item.id}"
                )
            if len(items) >= free:
                next_at = None  # at capacity: a finishing send wakes the loop
            elif next_at is not None and next_at <= now:
                continue  # a head fell due between the two queries
            await self._clock.wait(self._wake, next_at)

    async def _attempt(self, item: OutboxItem) -> None:
        try:
            if item.kind == "contract":
                outcome = await self._post(item)
            else:
                outcome = await self._mail(item)
            await self._record(item, outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one row's trouble must not stop the others
            log.error(
                "outbox attempt crashed outbox_id=%s case=%s error=%r", item.id, item.case_key, exc
            )
            await _pause(asyncio.Event(), STORE_PAUSE)  # its row stays due: not in a hot loop
        finally:
            self._in_flight.pop(item.queue, None)
            self._wake.set()

    # -- one attempt --------------------------------------------------------------

    async def _post(self, item: OutboxItem) -> _Result:
        peer = self._rt.directory.by_id.get(item.peer or "")
        if peer is None or not item.url:
            return _Result("failed", f"peer {item.peer!r} is not configured (any more)")
        body = item.payload if isinstance(item.payload, bytes) else item.payload.encode("utf-8")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {peer.token}"}
        assert self._client is not None
        try:
            async with self._client.post(
                item.url, data=body, headers=headers, allow_redirects=False
            ) as r:
                text = await _head_of(r)
                status = r.status
        except (aiohttp.InvalidURL, ValueError) as exc:
            return _Result("failed", f"url {item.url!r}: {exc}")
        except TimeoutError:
            return _Result("retry", f"timeout: no answer within {self._http_timeout:g} s")
        except aiohttp.ClientConnectorError as exc:
            return _Result("retry", f"connect failed: {exc.os_error or exc}")
        except aiohttp.ClientError as exc:  # connection refused or reset, protocol errors
            return _Result("retry", f"{type(exc).__name__}: {exc}")
        if 200 <= status < 300:
            return _Result("done", f"HTTP {status}")
        if 300 <= status < 500:
            return _Result("failed", f"HTTP {status}: {text}")
        return _Result("retry", f"HTTP {status}: {text}")

    async def _mail(self, item: OutboxItem) -> _Result:
        try:
            data = json.loads(item.payload)
            mail_from, rcpt_to = str(data["mail_from"]), str(data["rcpt_to"])
            domain, message = str(data["domain"]), str(data["message"]).encode("utf-8")
        except (ValueError, KeyError, TypeError) as exc:
            return _Result("failed", f"outbox row {item.id} is not a mail: {exc!r}")
        result = await self._mailer.send(OutboundMail(mail_from, rcpt_to, message, domain))
        outcome = {"ok": "done", "permanent": "failed"}.get(result.outcome, "retry")
        return _Result(outcome, result.describe())

    async def _record(self, item: OutboxItem, outcome: _Result) -> None:
        rt, now = self._rt, self._clock.now()
        result = outcome.result
        wakes = service.NO_WAKES
        if result == "done":
            await self._store.write(lambda db: service.outbox_done(db, item.id, now))
        elif result == "failed":
            wakes = await self._store.write(
                lambda db: service.outbox_failed(rt, db, item, outcome.detail, now)
            )
        else:
            kept, wakes = await self._store.write(
                lambda db: service.outbox_retry(rt, db, item, outcome.detail, now)
            )
            result = "retry" if kept else "gave-up"
        self._metrics.inc("masd_outbox_attempts_total", kind=item.kind, result=result)
        log.info(
            "outbox %s %s",
            result,
            " ".join(f"{k}={v}" for k, v in _describe(item, outcome.detail).items()),
        )
        if self._on_commit is not None:
            # Rows this job queued are this loop's to find (an attempt ending
            # wakes it); a deadline it wrote is the timer's.
            service.committed(self._on_commit, wakes)


def _look(
    db: Database, now: float, free: int, busy: Iterable[str]
) -> tuple[list[OutboxItem], float | None]:
    """Due queue heads (none of ``busy``) and when the next other head falls due."""
    items = service.due_outbox(db, now, free, exclude=busy) if free > 0 else []
    return items, service.next_outbox_at(db, {*busy, *(i.queue for i in items)})


async def _pause(event: asyncio.Event, seconds: float) -> None:
    """Rest a little real time after a fault (not clock time: a test clock may stand still)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


async def _head_of(response: aiohttp.ClientResponse) -> str:
    """The start of a response body (a peer's refusal detail), never all of it."""
    head = await response.content.read(BODY_KEEP * 4)
    return head.decode("utf-8", "replace")[:BODY_KEEP]


def _describe(item: OutboxItem, detail: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"outbox_id": item.id, "case": item.case_key, "kind": item.kind}
    try:
        payload = json.loads(item.payload)
    except ValueError:
        payload = {}
    if item.kind == "contract" and isinstance(payload, dict):
        fields.update(type=payload.get("type"), id=payload.get("id"))
        fields["handoff"] = payload.get("handoff_id")
        fields["peer"] = item.peer
    elif isinstance(payload, dict):
        found = _MESSAGE_ID.search(str(payload.get("message", "")).split("\r\n\r\n", 1)[0])
        fields.update(message_id=found.group(1) if found else None, to=payload.get("rcpt_to"))
    fields["attempt"] = item.attempts + 1
    fields["detail"] = json.dumps(detail)
    return fields
