#!/usr/bin/env bash
# What tests/test_bench_smoke.py drives (the benchmark's smoke run):
#   postfix        smtp-source and smtp-sink (installed as .ci/setup.d/postfix.sh does:
#                  "No configuration", so no system instance is set up or started)
#   wrk            the HTTP load generator for status callbacks
#   dovecot-lmtpd  Dovecot's LMTP, the durable C peer (the bench starts its own instance)
#   valgrind       callgrind, for bench.compare --instructions (instructions per mail)
# .ci/install-packages keeps services from starting at install time, so nothing is
# left running: the bench runs private instances on loopback ports.
set -euo pipefail
"$(dirname "$0")/../install-packages" postfix wrk dovecot-lmtpd valgrind
