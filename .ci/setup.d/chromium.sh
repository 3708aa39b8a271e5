#!/usr/bin/env bash
# What tests/test_console_browser.py drives: headless Chromium from Debian's chromium package,
# steered through WebDriver by Debian's chromedriver (package chromium-driver, built from the same
# source, so the two versions always match). The tests start their own browser with a fresh
# profile and stop it; nothing keeps running.
set -euo pipefail
"$(dirname "$0")/../install-packages" chromium chromium-driver fonts-dejavu-core
command -v chromium >/dev/null
command -v chromedriver >/dev/null
