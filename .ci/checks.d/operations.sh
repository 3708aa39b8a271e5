#!/usr/bin/env bash
# Run docs/operations.md: its ```sh commands verbatim and in order, as root on this machine
# (the script comes from tests/test_operations_doc.py).  Where the guide has systemd start
# masd, masd is started here the way masd.service would (user masd, /run/masd), and the
# guide's masd/runuser/curl lines run against it.  Afterwards the machine is put back:
# Postfix's configuration restored, masd stopped, the package purged, its files removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

work=$(mktemp -d)
cp -a /etc/postfix "$work/postfix"
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
    dpkg --purge masd >/dev/null 2>&1 || true
    rm -rf /etc/masd /var/lib/masd /run/masd "$work"
}
trap cleanup EXIT

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
SCRIPT
.venv/bin/python tests/test_operations_doc.py >>"$work/run.sh"

if ! bash "$work/run.sh" >"$work/guide.out" 2>&1; then
    echo "docs/operations.md failed; its output:" >&2
    cat "$work/guide.out" >&2
    if [ -f "$work/masd.log" ]; then cat "$work/masd.log" >&2; fi
    exit 1
fi
grep -q '"ok": *true' "$work/guide.out"
grep -q '^# TYPE masd_deliveries_total' "$work/guide.out"
echo "docs/operations.md: $(grep -vc '^: not run' "$work/run.sh") lines run"
