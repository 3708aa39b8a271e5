"""Every metric docs/operations.md §10 documents is on /metrics from masd's first scrape,
and every metric the shipped alert rules and dashboard name is one of them.

masd runs as a real process; /metrics is read right after READY=1, before any
mail, request or send, and compared with the table of the guide: each metric
has its HELP and TYPE line, each label the guide names is the one exported,
and a counter whose label values are known in advance has them all at 0.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from support.masd_process import WAIT, MasdProcess, write_master_config

from masd.metrics import COUNTERS
from masd.testing.peers import SmtpSink

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operations.md"
RULES = ROOT / "packaging" / "prometheus" / "masd-alerts.yml"
RULE_TESTS = ROOT / "packaging" / "prometheus" / "masd-alerts.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "masd.json"


def documented() -> dict[str, tuple[str, ...]]:
    """The metric table of §10: each metric's name and its labels, as the guide writes them."""
    text = GUIDE.read_text()
    table = text[text.index("### Metrics") : text.index("## 11.")]
    found: dict[str, tuple[str, ...]] = {}
    for match in re.finditer(r"^\| `(masd_[a-z_]+)(?:\{([a-z_,]+)\})?` \|", table, re.M):
        found[match.group(1)] = tuple(match.group(2).split(",")) if match.group(2) else ()
    return found


def parse(page: str) -> tuple[dict[str, str], dict[str, list[dict[str, str]]], dict[str, float]]:
    """(TYPE per name, label sets per name, value per series line) of a Prometheus text page."""
    types: dict[str, str] = {}
    helps: set[str] = set()
    series: dict[str, list[dict[str, str]]] = {}
    values: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line:
            match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
            assert match, line
            labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', match.group(2) or ""))
            series.setdefault(match.group(1), []).append(labels)
            values[line.rsplit(" ", 1)[0]] = float(match.group(3))
    assert helps == set(types), "every metric has both HELP and TYPE"
    return types, series, values


def test_the_guide_lists_every_metric_masd_knows() -> None:
    names = set(documented())
    assert set(COUNTERS) <= names
    assert len(names) >= 19


@pytest.fixture(scope="module")
def first_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/metrics of a masd just started: nothing delivered, sent or requested yet."""
    return asyncio.run(_first_scrape(tmp_path_factory.mktemp("metrics")))


def test_every_documented_metric_is_exported_from_the_start(first_page: str) -> None:
    types, series, values = parse(first_page)
    guide = documented()
    assert set(types) == set(guide), "the guide and /metrics list the same metrics"
    for name, labels in guide.items():
        assert types[name] == ("counter" if name.endswith("_total") else "gauge"), name
        for found in series.get(name, []):
            assert tuple(sorted(found)) == tuple(sorted(labels)), (name, found)
    for name, (_, label_sets) in COUNTERS.items():
        # Known label values at 0: none has happened yet.
        assert len(series.get(name, [])) == len(label_sets), name
    assert all(v == 0 for k, v in values.items() if k.endswith("_total") or "_total{" in k)
    assert values['masd_deliveries_total{outcome="fault"}'] == 0
    assert values['masd_outbox_record_failures_total{kind="mail"}'] == 0
    assert values['masd_connections_refused_total{listener="lmtp"}'] == 0
    assert values["masd_store_writable"] == 1


def named(text: str) -> set[str]:
    return set(re.findall(r"\bmasd_[a-z_]+\b", text))


def test_every_metric_the_alerts_and_the_dashboard_name_is_masd_s(first_page: str) -> None:
    exported = set(parse(first_page)[0])
    rules = named(RULES.read_text())
    board = named(DASHBOARD.read_text())
    assert rules <= exported, rules - exported
    assert board <= exported, board - exported
    assert board == exported, "the dashboard shows every metric"


def test_the_rule_tests_feed_series_shaped_like_masd_s(first_page: str) -> None:
    """Each input series of masd-alerts.test.yml: a metric masd exports, with its labels
    (and the instance and job Prometheus adds), no more and no fewer."""
    exported, guide = set(parse(first_page)[0]), documented()
    inputs = re.findall(r"series: '(masd_[a-z_]+)\{([^}]*)\}'", RULE_TESTS.read_text())
    assert len(inputs) > 20
    for name, labels in inputs:
        assert name in exported, name
        given = set(re.findall(r'([a-z_]+)="', labels)) - {"instance", "job"}
        assert given == set(guide[name]), (name, given)


async def _first_scrape(tmp_path: Path) -> str:
    async with SmtpSink() as sink:
        setup = write_master_config(
            tmp_path / "masd", endpoint_url="http://127.0.0.1:9/mas", smtp_port=sink.port
        )
        async with (
            MasdProcess(setup.config, tmp_path / "masd.log"),
            httpx.AsyncClient(base_url=setup.http_url, timeout=WAIT) as http,
        ):
            response = await http.get("/metrics")
            assert response.status_code == 200, response.text
            return response.text
