#!/usr/bin/env bash
# PostgreSQL for the tests of the PostgreSQL store (tests/test_pg_*.py), from Debian's package.
# The tests run a private server of their own (tests/support/postgres.py: initdb into a
# temporary directory, its own socket directory and loopback port, as the postgres user when
# run as root). Debian's postinst would otherwise create a system cluster "main" on port
# 5432: the createcluster.d drop-in below tells it not to (pg_createcluster by hand still
# works), and .ci/install-packages keeps any service from starting at install time.
set -euo pipefail
dropin=/etc/postgresql-common/createcluster.d/masd-tests.conf
if [ ! -e "$dropin" ]; then
    mkdir -p "$(dirname "$dropin")"
    echo "create_main_cluster = false" > "$dropin"
fi
"$(dirname "$0")/../install-packages" postgresql
ls -d /usr/lib/postgresql/*/bin/initdb
