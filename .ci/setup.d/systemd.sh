#!/usr/bin/env bash
# System programs for the systemd and packaging tests and checks:
#   systemd          systemd-analyze (verify, security), systemd-socket-activate
#   python3.11-venv  the virtualenv the Debian package carries (packaging/deb/build)
#   adduser          the package's postinst creates the user masd
#   pipx             `pipx install .` (tests/test_packaging.py)
set -euo pipefail
packages=(systemd python3.11-venv adduser pipx)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
