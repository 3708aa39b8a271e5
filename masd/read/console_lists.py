"""What the operator console lists beyond cases, threads and the queue: pending intakes and
suppressions (docs/operations.md §10, the console).

Each is one function of a store read job returning a list of JSON objects, the rows of one
console page.  The store keeps no list of either yet, so each returns none, and the page says
that none is there; once the store can list them, these functions return them and the pages
show them as they are.
"""

from __future__ import annotations

from typing import Any

from masd.store import Tx


def pending_intakes(tx: Tx) -> list[dict[str, Any]]:
    """Slave-role intakes their master has not assigned yet (``intake_ref``, ``domain``,
    ``type``, ``requested_mode``, ``from``, ``subject``, ``received_at``), oldest first."""
    del tx
    return []


def suppressions(tx: Tx) -> list[dict[str, Any]]:
    """Recipients suppressed after a permanent bounce (``address``, ``status``, ``since``,
    ``until``)."""
    del tx
    return []
