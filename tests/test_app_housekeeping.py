"""masd's hourly housekeeping (masd/app.py, App._housekeeping) when its store job fails."""

from __future__ import annotations

import asyncio
import logging

import pytest

from masd.app import App
from masd.store import StoreError


def _one_round(failure: Exception, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """One round of housekeeping whose purge raises ``failure``; the records it logged."""
    app = object.__new__(App)  # only purge is asked of it

    async def purge() -> dict[str, int]:
        raise failure

    app.purge = purge  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.ensure_future(app._housekeeping())
        for _ in range(100):
            if any(r.name == "masd.app" for r in caplog.records):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger="masd.app"):
        asyncio.run(main())
    return [r for r in caplog.records if r.name == "masd.app"]


def test_a_store_fault_is_one_line_that_names_it(caplog: pytest.LogCaptureFixture) -> None:
    fault = StoreError("store /x/masd.db: read failed: unable to open database file")
    (record,) = _one_round(fault, caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None  # no traceback for a fault the store names
    assert record.getMessage() == (f"housekeeping skipped: {fault}; trying again later")


def test_any_other_failure_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    (record,) = _one_round(KeyError("a bug"), caplog)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
