"""masd.edges.batch: the items that arrive during one write go together in the next."""

from __future__ import annotations

import asyncio

import pytest

from masd.edges.batch import Batch


class Writes:
    """Records each write; a write ends when the test opens its gate."""

    def __init__(self, fail: set[int] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail = fail or set()

    async def __call__(self, items: list[int]) -> None:
        self.calls.append(items)
        await self.gate.wait()
        if self.fail & set(items):
            raise OSError(f"disk full for {sorted(self.fail & set(items))}")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_items_arriving_during_a_write_share_the_next_one() -> None:
    async def body() -> list[list[int]]:
        writes = Writes()
        batch: Batch[int] = Batch(writes)
        first = asyncio.create_task(batch.add(1))
        await _settle()
        rest = [asyncio.create_task(batch.add(i)) for i in (2, 3, 4)]
        await _settle()
        assert writes.calls == [[1]]  # 2, 3, 4 wait for the write of 1
        writes.gate.set()
        await asyncio.gather(first, *rest)
        await batch.close()
        return writes.calls

    assert asyncio.run(body()) == [[1], [2, 3, 4]]


def test_a_failed_write_answers_its_own_callers_only() -> None:
    async def body() -> None:
        writes = Writes(fail={2})
        batch: Batch[int] = Batch(writes)
        first = asyncio.create_task(batch.add(1))
        await _settle()
        second = asyncio.create_task(batch.add(2))
        third = asyncio.create_task(batch.add(3))
        writes.gate.set()
        await first
        with pytest.raises(OSError, match=r"disk full for \[2\]"):
            await second
        with pytest.raises(OSError, match=r"disk full for \[2\]"):
            await third  # written with 2: the same refusal
        writes.fail = set()
        await batch.add(3)  # a later write is not held by the failed one
        assert writes.calls == [[1], [2, 3], [3]]

    asyncio.run(body())


def test_a_caller_that_stops_waiting_leaves_the_others_answered() -> None:
    async def body() -> None:
        writes = Writes()
        batch: Batch[int] = Batch(writes)
        gone = asyncio.create_task(batch.add(1))
        stays = asyncio.create_task(batch.add(2))
        await _settle()
        gone.cancel()
        writes.gate.set()
        await stays
        await batch.close()
        assert gone.cancelled()
        assert writes.calls == [[1, 2]]  # the write went ahead for both

    asyncio.run(body())
