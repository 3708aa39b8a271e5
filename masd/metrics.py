"""Counters for ``GET /metrics`` (Prometheus text format, docs/protocol.md §9).

A counter is a name, a help text and labelled values; gauges are read from
the store when the page is rendered (:func:`store_gauges`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Final

from masd.core.kinds import OUTBOX_KINDS
from masd.core.status import MACHINE
from masd.store import StoreHealth, Tx
from masd.store import gauges as counts

Series = dict[tuple[tuple[str, str], ...], float]
Gauges = dict[str, tuple[str, Series]]

Labels = tuple[tuple[str, str], ...]


def _each(**values: tuple[str, ...]) -> tuple[Labels, ...]:
    """Every combination of the label values given (in the order given), sorted by name."""
    combos: list[Labels] = [()]
    for name, options in values.items():
        combos = [(*combo, (name, option)) for combo in combos for option in options]
    return tuple(tuple(sorted(combo)) for combo in combos)


_KINDS = tuple(sorted(OUTBOX_KINDS))
#: Every counter: its help text and the label sets exported at 0 from the start (the values
#: known in advance; a counter labelled by peer or HTTP status has its HELP and TYPE only,
#: until its first series, whose first event alert rules see by its appearance).
#: docs/operations.md §10 lists them (tests/test_metrics_doc.py).
COUNTERS: Final[Mapping[str, tuple[str, tuple[Labels, ...]]]] = {
    "masd_deliveries_total": (
        "LMTP deliveries per recipient, by outcome.",
        _each(
            outcome=(
                "recorded",
                "duplicate",
                "unknown-case",
                "unknown-type",
                "unknown-domain",
                "bad-address",
                "too-big",
                "line-too-long",
                "fault",
                "busy",
                "too-many-sessions",
            )
        ),
    ),
    "masd_bounce_reads_total": (
        "Mails to bounce addresses read by the bounce reader, by outcome.",
        _each(outcome=("bounce", "no-bounce", "over-budget", "busy")),
    ),
    "masd_messages_total": (
        "Messages recorded, by DMARC verdict (absent: no trusted A-R).",
        _each(trust=("pass", "fail", "none", "temperror", "permerror", "absent")),
    ),
    "masd_outbox_attempts_total": (
        "Outbox delivery attempts, by kind and result.",
        _each(kind=_KINDS, result=("done", "retry", "failed", "gave-up")),
    ),
    "masd_outbox_circuit_total": (
        "Circuit breaker events of a peer or the relay (opened, reopened, closed).",
        (),
    ),
    "masd_outbox_record_failures_total": (
        "Sends whose outcome the store refused to record (recorded again later).",
        _each(kind=_KINDS),
    ),
    "masd_deadlines_fired_total": ("Handoff deadlines reached (timed-out recorded).", ((),)),
    "masd_policy_requests_total": (
        "Postfix policy delegation requests, by outcome.",
        _each(outcome=("dunno", "reject", "defer", "not-rcpt", "malformed")),
    ),
    "masd_milter_replies_total": (
        "Milter answers, by stage (rcpt, eom) and outcome.",
        _each(
            stage=("rcpt",),
            outcome=(
                "recipient-ok",
                "unknown-domain",
                "bad-address",
                "unknown-type",
                "unknown-case",
                "fault",
            ),
        )
        + _each(stage=("eom",), outcome=("too-big", "continue")),
    ),
    "masd_http_requests_total": ("Contract messages received over HTTP, by HTTP status.", ()),
    "masd_connections_refused_total": (
        "Connections refused over a listener's cap, by listener.",
        _each(listener=("lmtp", "http")),
    ),
    "masd_outbox_wakes_total": ("Times a commit that queued outbox rows woke the sender.", ((),)),
    "masd_timer_wakes_total": ("Times the deadline timer was woken to look again.", ((),)),
}


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[Labels, float]] = defaultdict(dict)
        for name, (_, label_sets) in COUNTERS.items():
            self._counters[name] = {labels: 0.0 for labels in label_sets}

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
        for name in sorted(set(COUNTERS) | set(self._counters)):
            help_text = COUNTERS[name][0] if name in COUNTERS else name
            lines.append(f"# HELP {name} {help_text}")
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


def _by_status(counts: Iterable[tuple[str, int]]) -> Series:
    out: Series = {(("status", s),): 0.0 for s in sorted(MACHINE.statuses)}
    for status, count in counts:
        out[(("status", status),)] = float(count)
    return out


def store_gauges(tx: Tx) -> Gauges:
    """Gauges for ``/metrics``, read in one store snapshot.

    - ``masd_outbox_depth{kind,state}``: outbox rows ``pending`` (waiting to
      be delivered) and ``failed`` (given up: 4xx or ``retry_for`` ran out).
    - ``masd_outbox_retries{kind}``: failed attempts of the rows still
      pending; each one scheduled a retry, so this is the retries the current
      backlog has needed (0 when every peer answers at the first try).
    - ``masd_handoffs{status}``: handoffs by their current status.
    - ``masd_handoff_statuses{status}``: statuses recorded over all handoffs
      (every transition, by email or by a mode).
    - ``masd_sends_refused{reason}``: ``mail.refused`` thread entries by
      reason (Principle 10 refusals, docs/protocol.md §4).

    The last two scan their tables; fine for a scrape every few seconds on
    a store of modest size.
    """
    kinds = sorted(OUTBOX_KINDS)
    depth: Series = {(("kind", k), ("state", s)): 0.0 for k in kinds for s in ("pending", "failed")}
    retries: Series = {(("kind", k),): 0.0 for k in kinds}
    for kind, state, count, attempts in counts.outbox_depth(tx):
        depth[(("kind", kind), ("state", state))] = float(count)
        if state == "pending":
            retries[(("kind", kind),)] = float(attempts)
    refused: Series = {
        (("reason", reason),): float(count) for reason, count in counts.refusals_by_reason(tx)
    }
    return {
        "masd_outbox_depth": ("Outbox rows pending or failed, by kind and state.", depth),
        "masd_outbox_retries": ("Failed attempts of outbox rows still pending.", retries),
        "masd_handoffs": ("Handoffs by current status.", _by_status(counts.handoffs_by_status(tx))),
        "masd_handoff_statuses": (
            "Handoff statuses recorded, by status.",
            _by_status(counts.statuses_by_status(tx)),
        ),
        "masd_sends_refused": ("Outbound mails refused under Principle 10, by reason.", refused),
    }


def health_gauges(health: StoreHealth, now: float | None = None) -> Gauges:
    """The store's health, as its writer last found it (:attr:`masd.store.Store.health`).

    - ``masd_store_writable``: 1 while the store accepts writes, 0 while it
      cannot commit (deliveries get ``451 4.3.0``, contract messages ``503``).
    - ``masd_store_unwritable_seconds``: how long it has not accepted writes
      (0 while it does).
    """
    lasted = 0.0 if health.writable else (time.time() if now is None else now) - health.since
    return {
        "masd_store_writable": (
            "1 while the store accepts writes, else 0.",
            {(): 1.0 if health.writable else 0.0},
        ),
        "masd_store_unwritable_seconds": (
            "Seconds since the store stopped accepting writes (0 while it accepts them).",
            {(): max(0.0, lasted)},
        ),
    }
