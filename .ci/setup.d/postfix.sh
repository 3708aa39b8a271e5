#!/usr/bin/env bash
# Postfix for tests/test_postfix_e2e.py, from Debian's package.
# Installed with "No configuration": no /etc/postfix/main.cf is written, so the
# system's own instance is never started and never binds port 25. The tests run
# private instances (postfix -c DIR start) on loopback ports of their own.
set -euo pipefail
"$(dirname "$0")/../install-packages" postfix
/usr/sbin/postconf -d mail_version
