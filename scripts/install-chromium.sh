#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver (packages chromium and chromium-driver) for the
# browser test when either is missing; does nothing when both are there. Needs root (or sudo)
# only when installing.
set -euo pipefail

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
  echo /usr/bin/chromium
  exit 0
fi

fail() {
  echo "install-chromium: $*" >&2
  exit 1
}

command -v apt-get >/dev/null 2>&1 \
  || fail "chromium or chromedriver is missing and apt-get is not available; install both by hand"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || fail "installing chromium needs root; run as root or install sudo"
  sudo=(sudo)
fi

echo "install-chromium: installing Debian's chromium and chromium-driver with apt-get" >&2
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver >&2; then
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update >&2 || fail "apt-get update failed"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver >&2 \
    || fail "apt-get install chromium chromium-driver failed"
fi
[[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] || fail "installed, but /usr/bin/chromium or /usr/bin/chromedriver is missing"
echo /usr/bin/chromium
