#!/usr/bin/env bash
# Real winmail.dat files for tests/test_tnef_samples.py, and the second reader they are compared with:
#   tnef (Debian)   Mark Simpson's TNEF unpacker, in C (GPL-2+)
#   tnefparse 1.4.0 its sdist's tests/examples/*.tnef, Outlook and Exchange mail collected by
#                   the project (LGPL-3.0; its LICENSE is copied beside the samples)
# The sdist comes from the package index through pip, as any dependency does; nothing else is
# fetched. The samples land in /usr/local/share/masd-tests/tnef (MASD_TNEF_SAMPLES overrides).
set -euo pipefail
"$(dirname "$0")/../install-packages" tnef
target="${MASD_TNEF_SAMPLES:-/usr/local/share/masd-tests/tnef}"
[ -e "$target/LICENSE" ] && exit 0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: -d "$work" "tnefparse==1.4.0"
tar -xzf "$work/tnefparse-1.4.0.tar.gz" -C "$work"
mkdir -p "$target"
cp "$work"/tnefparse-1.4.0/tests/examples/*.tnef "$target/"
cp "$work/tnefparse-1.4.0/LICENSE" "$target/LICENSE"
