#!/usr/bin/env bash
# What tests/test_prometheus_rules.py drives: promtool, from Debian's prometheus package, checks
# packaging/prometheus/masd-alerts.yml and runs its unit tests (masd-alerts.test.yml).
# .ci/install-packages keeps the package's service from starting at install time (policy-rc.d),
# so no Prometheus server is left running: only the promtool command is used.
set -euo pipefail
"$(dirname "$0")/../install-packages" prometheus
command -v promtool >/dev/null
