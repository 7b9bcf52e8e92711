#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver (packages chromium and chromium-driver) for the
# browser test when either is missing; does nothing when both are there. Prints the path of
# chromium on success.
set -euo pipefail
cd "$(dirname "$0")"

if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  ./apt-install.sh install-chromium chromium chromium-driver
  [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] \
    || { echo "install-chromium: installed, but /usr/bin/chromium or /usr/bin/chromedriver is missing" >&2; exit 1; }
fi
echo /usr/bin/chromium
