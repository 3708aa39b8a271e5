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
# .ci/install-packages keeps services from starting at install time: the tests run
# private instances on loopback.
set -euo pipefail
"$(dirname "$0")/../install-packages" postfix opendkim opendmarc publicsuffix dnsmasq-base miltertest openssl
