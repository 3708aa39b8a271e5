#!/usr/bin/env bash
# The real-mail corpus tests/test_mail_corpus.py reads (tests/mail_corpus.json names each source),
# from Debian's packages:
#   libpython3.11-testsuite  CPython's email test messages (/usr/lib/python3.11/test/test_email/data)
#   python3-flufl.bounce     bounces real MTAs sent, collected by GNU Mailman (flufl/bounce/tests/data)
#   s-nail, mutt             mail clients, run in batch mode to write messages at test time
#   mpack                    MIME attachments as mpack 1.6 writes them
#   sharutils                uuencode, for x-uuencode parts
#   tnef                     a second TNEF reader (in C), for tests/test_mime_cases.py's winmail.dat
set -euo pipefail
"$(dirname "$0")/../install-packages" libpython3.11-testsuite python3-flufl.bounce s-nail mutt mpack \
    sharutils tnef
