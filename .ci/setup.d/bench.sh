#!/usr/bin/env bash
# What tests/test_bench_smoke.py drives (the benchmark's smoke run):
#   postfix        smtp-source and smtp-sink (installed as .ci/setup.d/postfix.sh does:
#                  "No configuration", so no system instance is set up or started)
#   wrk            the HTTP load generator for status callbacks
#   dovecot-lmtpd  Dovecot's LMTP, the durable C peer (the bench starts its own instance)
# Services are kept from starting at install time (policy-rc.d), so nothing is
# left running: the bench runs private instances on loopback ports.
set -euo pipefail
packages=(postfix wrk dovecot-lmtpd)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi
echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
