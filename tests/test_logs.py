"""masd.logs: the log line is the standard library's, whatever the second."""

from __future__ import annotations

import logging

from masd.logs import FORMAT, LineFormatter


def _record(created: float, msg: str = "outbox done outbox_id=1") -> logging.LogRecord:
    record = logging.LogRecord("masd.outbox", logging.INFO, __file__, 1, msg, None, None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_lines_equal_the_standard_formatters_across_seconds() -> None:
    mine, stock = LineFormatter(), logging.Formatter(FORMAT)
    times = [1_780_000_000.0, 1_780_000_000.999, 1_780_000_001.001, 1_780_000_001.5]
    times += [1_780_003_599.9995, 1_780_003_600.0, 1_780_000_000.25]  # an hour turns; back again
    for created in times:
        record = _record(created)
        assert mine.format(record) == stock.format(record), created


def test_an_explicit_date_format_is_honoured() -> None:
    record = _record(1_780_000_000.5)
    assert LineFormatter().formatTime(record, "%Y") == logging.Formatter().formatTime(record, "%Y")


def test_libraries_that_log_every_request_are_kept_to_warnings() -> None:
    import masd.logs

    names = ("mail.log", "httpx")
    saved = {n: logging.getLogger(n).level for n in names}
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    srcfile = logging._srcfile
    try:
        masd.logs.configure_logging("INFO")
        for name in names:  # one line per decision, not one per LMTP command or HTTP request
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
            assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags
        logging._srcfile = srcfile
