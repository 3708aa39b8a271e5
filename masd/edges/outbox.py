"""The outbox sender: contract messages over HTTP and mail over SMTP (docs/protocol.md §5, §10).

Rows are queued by the service inside the transaction that caused them;
this loop delivers them.  The head of each queue (one case and one peer) is
sent at most once at a time, so "Messages about one case to one peer are
delivered in order".  Queues go in parallel within their lane
(:mod:`masd.edges.lanes`): each peer (URL origin) and the SMTP relay has its
own in-flight limit and its own circuit, so a peer that hangs or fails never
holds up another peer's messages or the mail.

Contract messages go through :class:`~masd.edges.contract_client.ContractClient`
(httpx), mail through a :class:`~masd.edges.mailer.MailTransport`.  Every
outcome is written back before its queue moves on: done (a mail the moment
the relay's ``250`` is in, in a transaction of its own while the lease is
held; the contract messages sent while one such job ran are marked in the
next, :class:`~masd.edges.batch.Batch`);
failed for good (the thread says why); or retried by
:func:`masd.service.outbox_retry` with the same ``id`` until ``server.retry_for``.

At least once, never a storm: an outcome the store refuses to record is
kept and recorded again after a backoff (1 s to 5 min), and its queue stays
taken meanwhile, so the message is not sent again (its lane slot is free
once the answer is in: the peer is no longer busy with it).  Only a
stop (or a crash) drops a kept outcome; the row is then still pending and
goes out once more after the restart.  A send cut short by :meth:`Outbox.stop`
likewise leaves its row pending.  A send whose case is erased meanwhile is broken off
(:meth:`Outbox.abandon`): its row is gone with the case.

Several hosts on one store (PostgreSQL): a row is sent by the host that holds
its lease (``server.claim_timeout``, :func:`masd.service.outbox_claim`), and
the lease is renewed every third of its length while the send lasts, so a
send longer than the lease (an SMTP session has ``SMTP_TIMEOUT`` per step) is
never taken over by another host while this one is alive; a host that dies
stops renewing, and its rows are another's within ``claim_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from masd import service
from masd.config import Dkim
from masd.edges import outbox_heads, outbox_leases
from masd.edges.batch import Batch
from masd.edges.context import EdgeContext
from masd.edges.contract_client import ContractClient
from masd.edges.lanes import RELAY, Attempt, Lanes, origin
from masd.edges.mailer import MailTransport, OutboundMail
from masd.edges.outbox_heads import HeadFinder
from masd.edges.signature_check import signed_headers
from masd.edges.smtp import SmtpTransport
from masd.logs import shown
from masd.service import OutboxItem, Runtime

log = logging.getLogger("masd.outbox")

#: Sends in flight to one peer (one URL origin) at most, and to the SMTP relay.
PEER_IN_FLIGHT: Final = 32
RELAY_IN_FLIGHT: Final = 16
SMTP_TIMEOUT: Final = 30.0
STOP_GRACE: Final = 10.0
#: How long the loop rests after the store failed it, before looking again.
STORE_PAUSE: Final = 1.0
#: Counter of wakes from outside (a commit queued rows).
WAKES_METRIC: Final = "masd_outbox_wakes_total"
#: The store is looked at this often at least, for rows no wake told of.
LOOK_SECONDS: Final = 5.0
_MESSAGE_ID = re.compile(r"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


class LiveKeys(Mapping[str, Sequence[Dkim]]):
    """Each domain's DKIM keys in the running configuration, as of each look."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def __getitem__(self, domain: str) -> Sequence[Dkim]:
        return self._rt.config.domains[domain].dkim_keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._rt.config.domains)

    def __len__(self) -> int:
        return len(self._rt.config.domains)


class Outbox:
    """Delivers pending outbox rows; see the module docstring."""

    def __init__(
        self,
        ctx: EdgeContext,
        *,
        mail: MailTransport | None = None,
        http: ContractClient | None = None,
        peer_in_flight: int = PEER_IN_FLIGHT,
        relay_in_flight: int = RELAY_IN_FLIGHT,
        http_timeout: float | None = None,
        smtp_timeout: float = SMTP_TIMEOUT,
        stop_grace: float = STOP_GRACE,
    ) -> None:
        rt = self._rt = ctx.rt
        self._store = ctx.store
        self._clock = ctx.clock
        metrics = self._metrics = ctx.metrics
        self._on_commit = ctx.listener
        server = rt.config.server
        self._mailer: MailTransport = mail or SmtpTransport(
            server.smtp_relay,
            hostname=server.hostname,
            keys=LiveKeys(rt),
            timeout=smtp_timeout,
            clock=ctx.clock,
        )
        timeout = server.peer_timeout if http_timeout is None else http_timeout
        self._http = http or ContractClient(timeout=timeout)
        self._lanes = Lanes(lambda key: relay_in_flight if key == RELAY else peer_in_flight)
        self._heads = HeadFinder()
        self._requeued: set[str] = set()  # queues to look at again, from the next look on
        self._stop_grace = stop_grace
        self._wake = asyncio.Event()
        self._halt = asyncio.Event()  # set by stop(): ends the pauses of kept outcomes
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._in_flight: dict[str, asyncio.Task[None]] = {}  # queue -> its send
        self._sending: dict[str, OutboxItem] = {}  # queue -> the row whose send is under way
        self._done: Batch[int] = Batch(self._write_done)  # rows sent, one job for many
        metrics.inc(WAKES_METRIC, 0.0)  # on /metrics from the start

    def start(self) -> None:
        """Start the loop (on the running event loop)."""
        if self._task is not None:
            raise RuntimeError("Outbox already started")
        self._task = asyncio.create_task(self._run(), name="masd-outbox")

    def wake(self, queues: Iterable[str] = (), rows: Sequence[OutboxItem] = ()) -> None:
        """New rows were committed: ``rows``, each its queue's head, are sent without
        reading them back; without them, look at the outbox now.  Look at the heads of
        ``queues`` too (an operator made one due now, or dropped it)."""
        self._metrics.inc(WAKES_METRIC)
        requeued = frozenset(queues)
        self._heads.hand(rows)
        if requeued or not rows:
            self._heads.unhanded()
        self._requeued |= requeued
        self._wake.set()

    def abandon(self, case_keys: Iterable[str]) -> None:
        """Break off the sends under way of these cases (erased: their rows are gone), so
        nothing but the cancel the erase queued goes out of them (docs/protocol.md §16.11)."""
        keys = frozenset(case_keys)
        self._heads.forget(keys)
        for queue, item in list(self._sending.items()):
            task = self._in_flight.get(queue)
            if item.case_key in keys and task is not None:
                log.info(
                    "outbox send broken off outbox_id=%s case=%s kind=%s: its case was erased",
                    item.id,
                    shown(item.case_key),
                    item.kind,
                    extra={"case": item.case_key},
                )
                task.cancel()

    async def adopt(self) -> None:
        """Look again at the queues whose head another host took and no longer holds
        (several hosts, one store: it died mid-send); they are this host's to send."""
        try:
            queues = await self._store.read(service.outbox_orphans)
        except Exception as exc:  # noqa: BLE001 - looked at again at the next poll
            log.warning("outbox read of expired leases failed error=%s", exc)
            return
        if queues:
            self.wake(queues)

    async def stop(self) -> None:
        """Take nothing new, let in-flight sends finish (at most ``stop_grace`` s), close."""
        self._stopping = True
        self._halt.set()
        self._wake.set()
        if self._task is not None:
            await self._task
        sends = list(self._in_flight.values())
        if sends:
            _, late = await asyncio.wait(sends, timeout=self._stop_grace)
            for task in late:
                task.cancel()  # its row stays pending: sent again after a restart
            await asyncio.gather(*late, return_exceptions=True)
        await self._done.close()
        await self._http.close()
        await self._mailer.close()

    # -- the loop ---------------------------------------------------------------

    async def _run(self) -> None:
        heads = self._heads
        while not self._stopping:
            self._wake.clear()  # before reading: a wake from now on is not lost
            # Not into a look under way: it may have read those heads before they changed.
            heads.ended |= self._requeued
            self._requeued = set()
            now = self._clock.now()
            # Handed rows first: a look asked after them counts their queues as busy.
            self._start_sends(heads.startable(frozenset(self._in_flight)), now)
            rooms = self._lanes.rooms(now)
            if heads.must_look(now, rooms, LOOK_SECONDS):
                if not await self._look(now, rooms):
                    continue
                if self._stopping:
                    break
                if heads.more:
                    continue  # a page of new rows or of rows falling due was full
                if heads.next_at is not None and heads.next_at <= self._clock.now():
                    continue  # a row fell due meanwhile
            times = (heads.next_at, self._lanes.next_open(now), heads.looked_at + LOOK_SECONDS)
            await self._clock.wait(self._wake, min(t for t in times if t is not None))

    async def _look(self, now: float, rooms: dict[str, int]) -> bool:
        """Read what may have changed since the last look and start it; False: the
        store failed (after a pause)."""
        ask = self._heads.ask(now, frozenset(self._in_flight), rooms)
        try:
            found = await self._store.read(functools.partial(outbox_heads.look, ask=ask))
        except Exception as exc:  # noqa: BLE001 - the store failing must not end the loop
            log.warning("outbox read failed error=%s", exc)
            await _pause(self._wake, STORE_PAUSE)
            return False
        if not self._stopping:
            self._heads.update(ask, found)
            self._start_sends(found.items, now)
        return True

    def _start_sends(self, items: list[OutboxItem], now: float) -> None:
        """Start what the lanes admit; the others wait for room in their lane."""
        for item in items:
            if item.queue in self._in_flight:
                continue
            lane = self._lane_of(item)
            self._heads.seen(lane, item)
            probe = self._lanes.take(lane, now)
            if probe is None:
                self._heads.turned_away(lane, item)
                continue
            self._in_flight[item.queue] = asyncio.create_task(
                self._attempt(item, lane, probe), name=f"masd-outbox-{item.id}"
            )

    def _lane_of(self, item: OutboxItem) -> str:
        if item.kind == "mail":
            return RELAY
        peer = self._rt.directory.by_id.get(item.peer or "")
        url = item.url or (peer.url if peer is not None else "")
        return origin(url) or f"peer:{item.peer}"

    async def _attempt(self, item: OutboxItem, lane: str, probe: bool) -> None:
        judged = False
        try:
            if not await outbox_leases.claimed(self._store, item):
                return  # another host holds it; looked at again when its lease ends
            async with outbox_leases.leased(self._store, item):
                self._sending[item.queue] = item
                try:
                    outcome = await self._send(item)
                finally:
                    self._sending.pop(item.queue, None)
                relayed = await self._relayed(item, outcome)
            # The peer is done with it: its lane slot is free while the queue
            # stays taken until the outcome is recorded.
            self._judge(lane, outcome, probe)
            judged = True
            self._lanes.release(lane)
            self._wake.set()
            await self._keep(item, outcome, relayed=relayed)
        finally:
            if not judged:  # cancelled at stop: no verdict on the peer
                self._lanes.judge(lane, None, self._clock.now(), probe=probe)
                self._lanes.release(lane)
            self._in_flight.pop(item.queue, None)
            self._heads.send_ended(item)  # its next head, or this row again later
            self._wake.set()

    def _judge(self, lane: str, outcome: Attempt, probe: bool) -> None:
        event = self._lanes.judge(lane, outcome.healthy, self._clock.now(), probe=probe)
        if event is None:
            return
        state = self._lanes[lane]
        if event == "closed":
            log.info("outbox circuit closed peer=%s", lane)
        else:
            wait = (state.open_until or 0.0) - self._clock.now()
            log.warning(
                "outbox circuit %s peer=%s failures=%d for=%.1fs detail=%s",
                event,
                lane,
                state.failures,
                wait,
                json.dumps(outcome.detail),
            )
        self._metrics.inc("masd_outbox_circuit_total", peer=lane, event=event)

    # -- one attempt --------------------------------------------------------------

    async def _send(self, item: OutboxItem) -> Attempt:
        try:
            if item.kind == "contract":
                return await self._post(item)
            return await self._mail(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one row's trouble must not stop the others
            log.error(
                "outbox attempt crashed outbox_id=%s case=%s error=%r",
                item.id,
                shown(item.case_key),
                exc,
                extra={"case": item.case_key},
            )
            return Attempt("retry", f"internal error: {exc!r}", healthy=None)

    async def _post(self, item: OutboxItem) -> Attempt:
        peer = self._rt.directory.by_id.get(item.peer or "")
        if peer is None or not item.url:
            return Attempt("failed", f"peer {item.peer!r} is not configured (any more)", None)
        body = item.payload if isinstance(item.payload, bytes) else item.payload.encode("utf-8")
        if not peer.signing.keys:
            return await self._http.post(item.url, body, peer.token)
        signed = signed_headers(peer.signing.keys, body, self._clock.now())
        return await self._http.post(item.url, body, peer.token, signed)

    async def _mail(self, item: OutboxItem) -> Attempt:
        try:
            data = json.loads(item.payload)
            mail_from, rcpt_to = str(data["mail_from"]), str(data["rcpt_to"])
            domain, message = str(data["domain"]), str(data["message"]).encode("utf-8")
        except (ValueError, KeyError, TypeError) as exc:
            return Attempt("failed", f"outbox row {item.id} is not a mail: {exc!r}", None)
        result = await self._mailer.send(OutboundMail(mail_from, rcpt_to, message, domain))
        if result.outcome == "ok":
            return Attempt("done", result.describe())
        if result.outcome == "permanent":
            return Attempt("failed", result.describe())
        return Attempt("retry", result.describe(), healthy=False)

    async def _relayed(self, item: OutboxItem, outcome: Attempt) -> bool | None:
        """A mail the relay took (its ``250``): recorded at once, in a transaction of its own
        and while the lease is held, so a host killed from now on does not leave it to be
        sent again (docs/operations.md §11).  True once recorded; False when the store
        refused (:meth:`_keep` records it after a backoff); None for any other outcome."""
        if item.kind != "mail" or outcome.result != "done":
            return None
        now, mark = self._clock.now(), self._heads.bare
        try:
            answer = await self._store.write(lambda db: service.outbox_relayed(db, item.id, now))
            done, behind = answer()
        except Exception as exc:  # noqa: BLE001 - recorded by _keep after a backoff
            self._metrics.inc("masd_outbox_record_failures_total", kind=item.kind)
            log.warning(
                "outbox done not recorded outbox_id=%s try=1 error=%s",
                item.id,
                json.dumps(str(exc)),
            )
            return False
        if done and not behind:  # nothing of its queue to look for, on any host's store
            self._heads.alone[item.id] = mark
        return True

    async def _keep(self, item: OutboxItem, outcome: Attempt, *, relayed: bool | None) -> None:
        """Record ``outcome`` (``relayed``: what :meth:`_relayed` did); while the store
        refuses, keep it and try again after a backoff."""
        failures = 0
        if relayed is False:
            failures = 1
            await _pause(self._halt, service.backoff(failures))
        while True:
            try:
                await self._record(item, outcome, recorded=relayed is True)
                return
            except Exception as exc:  # noqa: BLE001 - retried below; the send is not repeated
                failures += 1
                self._metrics.inc("masd_outbox_record_failures_total", kind=item.kind)
                fields = _describe(item, outcome.detail)
                if self._stopping:
                    log.warning(
                        "outbox %s not recorded at stop, sent again after a restart "
                        "outbox_id=%s error=%s",
                        outcome.result,
                        item.id,
                        json.dumps(str(exc)),
                    )
                    return
                delay = service.backoff(failures)
                log.warning(
                    "outbox %s not recorded outbox_id=%s case=%s try=%d again_in=%.1fs error=%s",
                    outcome.result,
                    item.id,
                    shown(fields["case"]),
                    failures,
                    delay,
                    json.dumps(str(exc)),
                    extra={"case": item.case_key},
                )
                await _pause(self._halt, delay)

    async def _record(self, item: OutboxItem, outcome: Attempt, *, recorded: bool) -> None:
        rt, now = self._rt, self._clock.now()
        result: str = outcome.result
        wakes = service.NO_WAKES
        if result == "done":
            if not recorded:
                await self._done.add(item.id)
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
            " ".join(f"{k}={shown(v)}" for k, v in _describe(item, outcome.detail).items()),
            extra={"case": item.case_key},
        )
        # Rows this job queued are this loop's to find (an attempt ending
        # wakes it); a deadline it wrote is the timer's.
        self._on_commit.committed(wakes)

    async def _write_done(self, item_ids: list[int]) -> None:
        now = self._clock.now()
        await self._store.write(lambda db: service.outbox_done_many(db, item_ids, now))


async def _pause(event: asyncio.Event, seconds: float) -> None:
    """Rest a little real time after a fault (not clock time: a test clock may stand still)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


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
