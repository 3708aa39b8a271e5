"""Outbox leases, where several hosts share the store (PostgreSQL): a row is sent by the
host that holds its lease (``server.claim_timeout``, :func:`masd.service.outbox_claim`, or
taken as the row was queued, :func:`masd.store.outbox.queue_item`), renewed every third of
its length while the send lasts (see :mod:`masd.edges.outbox`).
Where one host is the store's writer (SQLite) every row is its own: nothing is asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from masd import service
from masd.service import OutboxItem
from masd.store import StoreHandle

log = logging.getLogger("masd.outbox")


def lease_of(store: StoreHandle) -> float | None:
    """The length of a lease on ``store``; None where one host sends."""
    lease: float | None = getattr(store, "claim_seconds", None)
    return lease


async def claimed(store: StoreHandle, item: OutboxItem) -> bool:
    """Whether this host sends ``item`` now: always where it is the store's one
    writer; where several hosts share the store, once it holds the row's lease (a row it
    queued as its queue's head it holds already, for a while: ``item.held_until``)."""
    lease = lease_of(store)
    if lease is None or item.held_until > time.monotonic():
        return True
    host: str = getattr(store, "host", "")
    try:
        taken = await store.write(lambda db: service.outbox_claim(db, [item.id], host, lease))
    except Exception as exc:  # noqa: BLE001 - the store failing must not end the loop
        log.warning("outbox claim failed id=%s error=%s", item.id, exc)
        return False
    return item.id in taken


@contextlib.asynccontextmanager
async def leased(store: StoreHandle, item: OutboxItem) -> AsyncIterator[None]:
    """While a send lasts, renew its lease every third of it (several hosts only)."""
    lease = lease_of(store)
    if lease is None:
        yield
        return
    renewer = asyncio.create_task(_renew(store, item, lease), name=f"masd-lease-{item.id}")
    try:
        yield
    finally:
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)


async def _renew(store: StoreHandle, item: OutboxItem, lease: float) -> None:
    host: str = getattr(store, "host", "")
    while True:
        await asyncio.sleep(lease / 3)
        try:
            held = await store.write(lambda db: service.outbox_renew(db, item.id, host, lease))
        except Exception as exc:  # noqa: BLE001 - the send goes on; the lease may lapse
            log.warning("outbox lease renewal failed id=%s error=%s", item.id, exc)
            continue
        if not held:
            log.warning("outbox lease lost id=%s: another host may send it too", item.id)
            return
