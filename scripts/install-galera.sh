#!/usr/bin/env bash
# Installs what the Galera tests and benchmark run, from Debian packages, skipping what is there:
# MariaDB's server (`mariadbd`, `mariadb-install-db`), the Galera provider (galera-4), rsync (the
# snapshot transfer) and HAProxy (in front of the three nodes). A package that cannot be
# installed fails the run with its name. Prints the path of haproxy on success.
set -euo pipefail
cd "$(dirname "$0")"
export PATH=$PATH:/usr/sbin

provider=/usr/lib/galera/libgalera_smm.so
missing=()
for need in mariadbd:mariadb-server mariadb-install-db:mariadb-server rsync:rsync haproxy:haproxy; do
  command -v "${need%%:*}" >/dev/null 2>&1 || missing+=("${need#*:}")
done
[[ -f $provider ]] || missing+=(galera-4)
if ((${#missing[@]})); then
  # shellcheck disable=SC2046
  ./apt-install.sh install-galera $(printf '%s\n' "${missing[@]}" | sort -u)
fi
for tool in mariadbd mariadb-install-db rsync haproxy; do
  command -v "$tool" >/dev/null 2>&1 \
    || { echo "install-galera: $tool is still missing after the install" >&2; exit 1; }
done
[[ -f $provider ]] || { echo "install-galera: the galera-4 package was installed but $provider is missing" >&2; exit 1; }
command -v haproxy
