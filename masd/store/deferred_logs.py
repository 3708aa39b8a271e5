"""Log lines of a store job, held until the job commits (where a job may run more than once).

On PostgreSQL a job that loses a race with another host is rolled back and run
again (:mod:`masd.store.pg_backend`), so whatever it does outside its transaction
would happen once per run.  The service's jobs have one such effect: the lines they
log (``status recorded``, ``intake pending`` ...).  :data:`HOLD` is a filter on the
``masd`` logger, the one those jobs log to: while an attempt runs under
:func:`held` (in its thread, or in its own context as a job of the event loop),
each record is kept instead of emitted; :func:`release` emits the records of the run
that committed, and those of the runs rolled back are dropped.
Everything else a job produces (its wakes, the statuses it recorded) is its return
value, which the caller sees only from the run that committed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Final

#: The records being held, in the context of the job that logs them: a thread's, or a
#: job's of the event loop (masd.store.pg_loop runs each in a context of its own).
_held: ContextVar[list[logging.LogRecord] | None] = ContextVar("masd_held_logs", default=None)


class _Hold(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        records = _held.get()
        if records is None:
            return True
        records.append(record)
        return False


#: The filter, on the ``masd`` logger once a store that may re-run jobs is opened.
HOLD: Final = _Hold()
#: The logger the service's jobs log to.
JOB_LOGGER: Final = "masd"


def install() -> None:
    """Hold the job logger's records in :func:`held` blocks (idempotent)."""
    logging.getLogger(JOB_LOGGER).addFilter(HOLD)


@contextlib.contextmanager
def held() -> Iterator[list[logging.LogRecord]]:
    """This context's records to the job logger, kept in the list given, not emitted."""
    records: list[logging.LogRecord] = []
    token = _held.set(records)
    try:
        yield records
    finally:
        _held.reset(token)


def release(records: list[logging.LogRecord]) -> None:
    """Emit ``records`` (a committed run's) as they would have been."""
    for record in records:
        logging.getLogger(record.name).handle(record)
