"""Times as masd shows them: RFC 3339 UTC strings with ``Z``, second precision.

The store keeps epoch seconds; the read side, the queue and ``masd explain``
show them in this one form.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(ts: float | None) -> str | None:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SSZ`` (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
