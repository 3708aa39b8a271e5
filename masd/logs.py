"""masd's log lines: time, level, component, then ``key=value`` pairs.

One line per decision goes to standard error (the journal, under systemd).
The line is the standard library's ``%(asctime)s %(levelname)s %(name)s
%(message)s``; :class:`LineFormatter` writes the same text, formatting each
second's date and time once instead of once per line (a line is written per
delivery, per status and per outbox attempt).
"""

from __future__ import annotations

import logging
import time
from typing import Final

FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


class LineFormatter(logging.Formatter):
    """:data:`FORMAT`, with the ``asctime`` of each second computed once."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:  # handlers format under their lock: no race here
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"  # the default_msec_format, "%s,%03d"


def configure_logging(level: str = "INFO") -> None:
    """Log at ``level`` (DEBUG, INFO, WARNING or ERROR) to standard error."""
    handler = logging.StreamHandler()
    handler.setFormatter(LineFormatter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # The format names no thread, process or source line: none is looked up
    # for every record (the logging HOWTO's "Optimization" table).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # the HOWTO's documented switch
    # aiosmtpd logs every LMTP command at INFO (about 8 lines per delivery,
    # a quarter of intake throughput) and httpx every request; masd logs one
    # line per decision (the outbox's names the answer httpx would log).
    for chatty in ("mail.log", "httpx"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.root.level))
