#!/usr/bin/env bash
# Run docs/operations.md: its ```sh commands verbatim and in order, as root on this machine
# (the script comes from tests/test_operations_doc.py).  Where the guide has systemd start
# masd, masd is started here the way masd.service would (user masd, /run/masd), and the
# guide's masd/runuser/curl lines run against it.  Afterwards the machine is put back:
# Postfix's configuration restored, masd stopped, the package purged, its files removed.
#
# Section 11 moves the store to PostgreSQL on a database server of its own: here a Debian
# cluster (pg_createcluster) listening on 127.0.0.2:5432 only, named db.internal in
# /etc/hosts, with nothing set up for masd: the guide's ```sh db lines make the role, the
# database and the pg_hba.conf line, and masd then serves on that database.  The cluster
# and the /etc/hosts line are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
[ "$(id -u)" -eq 0 ] || { echo "operations.sh runs as root (it installs the package)" >&2; exit 1; }

work=$(mktemp -d)
cp -a /etc/postfix "$work/postfix"
cp -a /etc/hosts "$work/hosts"
pgversion=$(ls /usr/lib/postgresql | sort -n | tail -1)
cluster=masd-guide
cleanup() {
    cd "$root"
    if [ -f "$work/masd.pid" ]; then
        kill -TERM "$(cat "$work/masd.pid")" 2>/dev/null || true
        for _ in $(seq 300); do
            kill -0 "$(cat "$work/masd.pid")" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -rf /etc/postfix && cp -a "$work/postfix" /etc/postfix
    cat "$work/hosts" >/etc/hosts
    pg_dropcluster --stop "$pgversion" "$cluster" >/dev/null 2>&1 || true
    dpkg --purge masd >/dev/null 2>&1 || true
    rm -rf /etc/masd /var/lib/masd /run/masd "$work"
}
trap cleanup EXIT

# The database server of section 11, as its administrator left it: PostgreSQL on its own
# address, nothing of masd's in it.
if pg_lsclusters -h | awk '$3 == 5432 && $4 == "online"' | grep -q .; then
    echo "a PostgreSQL cluster is online on port 5432 already; section 11 needs that port" >&2
    exit 1
fi
pg_createcluster "$pgversion" "$cluster" -p 5432 >/dev/null
echo "listen_addresses = '127.0.0.2'" >"/etc/postgresql/$pgversion/$cluster/conf.d/listen.conf"
pg_ctlcluster "$pgversion" "$cluster" start
echo "127.0.0.2 db.internal" >>/etc/hosts

# start_masd: what masd.service does (RuntimeDirectory=, User=masd), then wait for /healthz.
cat >"$work/run.sh" <<SCRIPT
start_masd() {
    install -d -o masd -g masd -m 0750 /run/masd
    runuser -u masd -- masd serve --config /etc/masd/masd.toml >"$work/masd.log" 2>&1 &
    echo \$! >"$work/masd.pid"
    for _ in \$(seq 300); do
        curl -sf http://127.0.0.1:8025/healthz >/dev/null && return 0
        kill -0 "\$(cat "$work/masd.pid")" 2>/dev/null || break
        sleep 0.1
    done
    echo "masd did not start" >&2
    return 1
}
stop_masd() {
    kill -TERM "\$(cat "$work/masd.pid")"
    for _ in \$(seq 300); do
        kill -0 "\$(cat "$work/masd.pid")" 2>/dev/null || { rm -f "$work/masd.pid"; return 0; }
        sleep 0.1
    done
    echo "masd did not stop" >&2
    return 1
}
SCRIPT
# The masd hosts as the database server sees them: this one, from 127.0.0.1.
.venv/bin/python tests/test_operations_doc.py MASDHOSTS=127.0.0.1/32 >>"$work/run.sh"

if ! bash "$work/run.sh" >"$work/guide.out" 2>&1; then
    echo "docs/operations.md failed; its output:" >&2
    cat "$work/guide.out" >&2
    if [ -f "$work/masd.log" ]; then cat "$work/masd.log" >&2; fi
    exit 1
fi
grep -q '"ok": *true' "$work/guide.out"
grep -q '^# TYPE masd_deliveries_total' "$work/guide.out"
# masd serves on the database of section 11, on the other address: ready on it, and its
# tables are there (written by masd db copy and masd itself, as the role the guide made).
grep -q 'ready .*database=postgresql://masd@db.internal/masd' "$work/masd.log"
owner=$(runuser -u postgres -- psql -d masd -Atc \
    "SELECT tableowner FROM pg_tables WHERE tablename = 'cases'")
[ "$owner" = masd ] || { echo "the cases table is not masd's: '$owner'" >&2; exit 1; }
echo "docs/operations.md: $(grep -vc '^: not run' "$work/run.sh") lines run"
