#!/usr/bin/env bash
# The DMARC chain tests/test_dmarc_e2e.py drives, and the milter client tests/test_milter.py
# uses, for real,
# from Debian's packages:
#   postfix          the MTA (as .ci/setup.d/postfix.sh installs it: "No configuration")
#   opendkim         the DKIM verifier milter
#   opendmarc        the DMARC milter (SPF checked by itself); publicsuffix its list
#   dnsmasq-base     the DNS server on loopback serving the test domains' records
#                    (the binary only: no system service)
#   miltertest       OpenDKIM's milter test client, scripted in Lua
#   openssl          makes the tests' DKIM keys, as dknewkey does
# Services are kept from starting at install time (policy-rc.d): the tests run
# private instances on loopback.
set -euo pipefail
packages=(postfix opendkim opendmarc publicsuffix dnsmasq-base miltertest openssl)
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
