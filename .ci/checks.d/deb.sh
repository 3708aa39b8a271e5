#!/usr/bin/env bash
# Build the Debian package, install it on this machine, and run masd from it:
# check-config against the example it installs, as root and as the user masd (refused for
# its placeholder secrets only), and against a copy with secrets of its own;
# systemd-analyze verify on the installed units; reinstall (the upgrade path);
# purge (the store directory and the user stay).
set -euo pipefail
cd "$(dirname "$0")/../.."

deb=$(make --no-print-directory package 2>/dev/null | tail -n 1)
echo "built $deb"
apt-get install -y -qq "./$deb" >/dev/null

test "$(readlink /usr/bin/masd)" = /opt/masd/bin/masd
masd --version
# The example as installed: read by root and by masd alike, refused for its four public
# placeholder secrets and for nothing else (no permission error).
placeholders_only() {
    local out
    if out=$("$@" 2>&1); then echo "$*: accepted the placeholder secrets" >&2; return 1; fi
    test "$(grep -c 'holds a placeholder secret shipped with masd' <<<"$out")" = 4 \
        && grep -q '^masd: 4 errors in ' <<<"$out" \
        || { echo "$*: $out" >&2; return 1; }
}
placeholders_only masd check-config /etc/masd/masd.toml.example
placeholders_only runuser -u masd -- masd check-config /etc/masd/masd.toml.example
test "$(stat -c %U:%G:%a /etc/masd/secrets-example/admin.token)" = masd:masd:600
test -f /usr/share/doc/masd/dmarc/opendkim.conf
test -f /usr/share/doc/masd/postfix/main.cf.snippet
getent passwd masd >/dev/null
test "$(stat -c %U:%G:%a /var/lib/masd)" = masd:masd:750
test "$(stat -c %U:%G:%a /etc/masd)" = root:masd:750
# The service's view: the user masd reads its config (here a copy it may read).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r /etc/masd/secrets-example "$work/" && cp /etc/masd/masd.toml.example "$work/masd.toml"
for token in "$work"/secrets-example/*.token; do head -c 32 /dev/urandom | base64 >"$token"; done
chown -R masd:masd "$work"
runuser -u masd -- masd check-config "$work/masd.toml" >/dev/null
# The store: migrations and an online backup, as the user masd, in its state directory.
sed -i 's#^database = .*#database = "/var/lib/masd/ci.db"#' "$work/masd.toml"
runuser -u masd -- masd db migrate --config "$work/masd.toml"
runuser -u masd -- masd db backup --config "$work/masd.toml" /var/lib/masd/ci-backup.db
rm -f /var/lib/masd/ci.db* /var/lib/masd/ci-backup.db
systemd-analyze verify /lib/systemd/system/masd.service /lib/systemd/system/masd-lmtp.socket \
    /lib/systemd/system/masd-http.socket
systemd-analyze security --offline=yes --no-pager /lib/systemd/system/masd.service \
    | grep 'Overall exposure level'

dpkg -i "$deb" >/dev/null   # the same version again: postinst's upgrade path
placeholders_only runuser -u masd -- masd check-config /etc/masd/masd.toml.example

dpkg --purge masd >/dev/null
test ! -e /usr/bin/masd
test ! -e /opt/masd
test ! -e /etc/masd/masd.toml.example
getent passwd masd >/dev/null   # kept: files in /var/lib/masd may still belong to it
echo "deb package: built, installed, check-config ran from it, purged"
