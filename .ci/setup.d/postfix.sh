#!/usr/bin/env bash
# Postfix for tests/test_postfix_e2e.py, from Debian's package.
# Installed with "No configuration": no /etc/postfix/main.cf is written, so the
# system's own instance is never started and never binds port 25. The tests run
# private instances (postfix -c DIR start) on loopback ports of their own.
set -euo pipefail
if ! dpkg-query -W -f='${Status}' postfix 2>/dev/null | grep -q "install ok installed"; then
    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postfix >/dev/null
fi
/usr/sbin/postconf -d mail_version
