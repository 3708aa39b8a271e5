"""The alert rules and the Grafana dashboard that ship (packaging/prometheus/, packaging/grafana/).

promtool (Debian's prometheus package) checks the rules and runs their unit
tests, masd-alerts.test.yml, whose input series are shaped like masd's own
/metrics; every alert has a test where it fires and one where it does not.
The dashboard's queries are checked by the same PromQL parser, as recording
rules.  tests/test_metrics_doc.py checks every metric they name against a
running masd's /metrics.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from support.system import require_program

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "packaging" / "prometheus"
RULES = PROMETHEUS / "masd-alerts.yml"
RULE_TESTS = PROMETHEUS / "masd-alerts.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "masd.json"


def promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    program = require_program("promtool")
    return subprocess.run(
        [program, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def alerts() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M)


def dashboard_queries() -> list[str]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def test_the_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_every_rule_passes_its_unit_tests() -> None:
    done = promtool("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    quiet, firing = set(), set()
    for case in RULE_TESTS.read_text().split("eval_time: ")[1:]:
        name = re.search(r"alertname: (\w+)", case)
        assert name is not None, case
        (quiet if "exp_alerts: []" in case else firing).add(name.group(1))
    assert set(alerts()) == firing, set(alerts()) ^ firing
    assert set(alerts()) == quiet, set(alerts()) ^ quiet


def test_a_broken_rule_test_fails(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against a rule that watches another outcome."""
    (tmp_path / RULES.name).write_text(
        RULES.read_text().replace('{outcome="fault"}[5m]', '{outcome="recorded"}[5m]')
    )
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    done = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert done.returncode == 1
    assert "alertname: MasdDeliveryFaults" in done.stdout + done.stderr


def test_the_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """Each query, its Grafana variable replaced, parsed by promtool as a recording rule."""
    queries = dashboard_queries()
    assert len(queries) >= 19
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for n, query in enumerate(queries):
        expr = re.sub(r"^label_values\((\w+), (\w+)\)$", r"count by (\2) (\1)", query)
        expr = expr.replace("$instance", ".*")
        lines += [f"      - record: dashboard:query{n}", f"        expr: {json.dumps(expr)}"]
    rules = tmp_path / "dashboard.yml"
    rules.write_text("\n".join(lines) + "\n")
    done = promtool("check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_grafana_json_for_a_chosen_datasource() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "masd"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert 'instance=~"$instance"' in target["expr"], target["expr"]


def test_the_guide_describes_every_alert_and_each_dashboard_row() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    section = guide[guide.index("### Dashboard and alerts") : guide.index("## 11.")]
    described = set(re.findall(r"^\| `(Masd\w+)`", section, re.M))
    assert described == set(alerts())
    board = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert all(f"\n| {row} |" in section for row in rows), rows
