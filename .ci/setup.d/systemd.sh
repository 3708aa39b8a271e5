#!/usr/bin/env bash
# System programs for the systemd and packaging tests and checks:
#   systemd          systemd-analyze (verify, security), systemd-socket-activate
#   python3.11-venv  the virtualenv the Debian package carries (packaging/deb/build)
#   adduser          the package's postinst creates the user masd
#   pipx             `pipx install .` (tests/test_packaging.py)
set -euo pipefail
"$(dirname "$0")/../install-packages" systemd python3.11-venv adduser pipx
