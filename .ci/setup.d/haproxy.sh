#!/usr/bin/env bash
# HAProxy for tests/test_pg_front.py: two masd hosts on one PostgreSQL behind the front shipped
# in packaging/haproxy/, run by the test as a private haproxy on loopback (its own config and
# ports).  .ci/install-packages keeps the package's service from starting at install time, so
# no system haproxy is left running: only the haproxy program is used.
set -euo pipefail
"$(dirname "$0")/../install-packages" haproxy
command -v haproxy >/dev/null
