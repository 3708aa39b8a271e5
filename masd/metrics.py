"""Counters for ``GET /metrics`` (Prometheus text format, PROFILE §6).

A counter is a name, a help text and labelled values; gauges are read from
the store when the page is rendered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

_HELP = {
    "masd_deliveries_total": "LMTP deliveries per recipient, by outcome.",
    "masd_messages_total": "Messages recorded, by DMARC verdict (absent: no trusted A-R).",
    "masd_outbox_attempts_total": "Outbox delivery attempts, by kind and result.",
    "masd_deadlines_fired_total": "Handoff deadlines reached (timed-out recorded).",
    "masd_policy_requests_total": "Postfix policy delegation requests, by outcome.",
    "masd_http_requests_total": "Contract messages received over HTTP, by HTTP status.",
    "masd_outbox_wakes_total": "Times a commit that queued outbox rows woke the sender.",
    "masd_timer_wakes_total": "Times the deadline timer was woken to look again.",
}


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._counters[name]
        series[key] = series.get(key, 0.0) + amount

    def value(self, name: str, **labels: str) -> float:
        return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(
        self, gauges: Mapping[str, tuple[str, Mapping[tuple[tuple[str, str], ...], float]]] = {}
    ) -> str:
        lines: list[str] = []
        for name in sorted(set(_HELP) | set(self._counters)):
            lines.append(f"# HELP {name} {_HELP.get(name, name)}")
            lines.append(f"# TYPE {name} counter")
            for labels, value in sorted(self._counters.get(name, {}).items()):
                lines.append(f"{name}{_labels(labels)} {value:g}")
        for name, (help_text, series) in sorted(gauges.items()):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} gauge")
            for labels, value in sorted(series.items()):
                lines.append(f"{name}{_labels(labels)} {value:g}")
        return "\n".join(lines) + "\n"


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_esc(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
