"""The watch on recorded mail's trust: counts each verdict, warns on a run of untrusted ones.

The LMTP edge tells :class:`TrustWatch` each recorded message's verdict; it
counts ``masd_messages_total`` by outcome and logs a warning when the last
:data:`WINDOW` messages carried no trusted result (``masd doctor`` says why,
:mod:`masd.ops.doctor`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from masd.metrics import Metrics

log = logging.getLogger("masd.trust")

#: Messages in a row without a trusted result before the log warns.
WINDOW: Final = 100
METRIC: Final = "masd_messages_total"


class TrustWatch:
    """Counts recorded messages by trust outcome; warns on a run of untrusted ones."""

    def __init__(self, metrics: Metrics, trusted_ids: Sequence[str]) -> None:
        self.metrics = metrics
        self.trusted_ids = tuple(trusted_ids)
        self.untrusted_run = 0

    def observe(self, dmarc: str) -> None:
        """One recorded message's verdict (``auth.dmarc``; ``absent``: no trusted A-R)."""
        self.metrics.inc(METRIC, trust=dmarc)
        if dmarc != "absent":
            self.untrusted_run = 0
            return
        self.untrusted_run += 1
        if self.untrusted_run % WINDOW == 0:
            log.warning(
                "the last %d messages carried no trusted dmarc result "
                "(server.trusted_authserv_ids = %s): none can pass DMARC; "
                "run masd doctor for the cause",
                self.untrusted_run,
                ", ".join(self.trusted_ids) or "[]",
            )
