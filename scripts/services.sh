#!/usr/bin/env bash
# Starts the local services the tests need (PostgreSQL, MariaDB, Redis, RabbitMQ) when they are not
# running, waits until each answers, and drops scratch databases and stores that earlier runs
# left behind.
# A service that cannot be started is an error: the tests never skip a missing service.
set -euo pipefail

wait_for() { # name, check command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services: $name did not come up within 30 s" >&2
  return 1
}

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q; }
if ! pg_up; then
  echo "services: starting PostgreSQL" >&2
  command -v pg_ctlcluster >/dev/null || { echo "services: PostgreSQL is not installed" >&2; exit 1; }
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
wait_for PostgreSQL pg_up

mariadb_up() { mariadb-admin -h 127.0.0.1 -u root ping --silent >/dev/null 2>&1; }
if ! mariadb_up; then
  echo "services: starting MariaDB" >&2
  [[ -x /usr/sbin/mariadbd ]] || { echo "services: MariaDB is not installed" >&2; exit 1; }
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
fi
wait_for MariaDB mariadb_up

redis_up() { [[ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" == PONG ]]; }
if ! redis_up; then
  echo "services: starting Redis" >&2
  command -v redis-server >/dev/null || { echo "services: Redis is not installed" >&2; exit 1; }
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_for Redis redis_up

rabbitmq_up() { rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1; }
if ! rabbitmq_up; then
  echo "services: starting RabbitMQ" >&2
  command -v rabbitmq-server >/dev/null || { echo "services: RabbitMQ is not installed" >&2; exit 1; }
  rabbitmq-server -detached
fi
wait_for RabbitMQ rabbitmq_up

# Scratch databases of runs that were killed before they could drop them.
for db in $(psql -h 127.0.0.1 -U postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'idemgate\_scratch\_%'"); do
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null
done
for db in $(mariadb -h 127.0.0.1 -u root -Ne "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'idemgate\\_scratch\\_%'"); do
  mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS \`$db\`"
done
# Broker stores and Galera data directories whose process is gone: a run killed before its
# watchdogs could remove them. A folder is named after the process that made it
# (idemgate-rocketmq-<pid>-*); one without a process id in its name goes when no running
# process works inside it.
in_use() { # dir
  local cwd
  for cwd in /proc/[0-9]*/cwd; do
    [[ "$(readlink "$cwd" 2>/dev/null)" == "$1"* ]] && return 0
  done
  return 1
}
for dir in "${TMPDIR:-/tmp}"/idemgate-rocketmq-* "${TMPDIR:-/tmp}"/idemgate-galera-* "${TMPDIR:-/tmp}"/idemgate-tansu-*; do
  [[ -d "$dir" ]] || continue
  owner=$(basename "$dir" | cut -d- -f3)
  if [[ "$owner" =~ ^[0-9]+$ && "$(basename "$dir" | cut -d- -f4)" != "" ]]; then
    kill -0 "$owner" 2>/dev/null || rm -rf "$dir"
  elif ! in_use "$dir"; then
    rm -rf "$dir"
  fi
done
df -h "${TMPDIR:-/tmp}" | awk 'NR == 2 { print "services: the disk holding the stores is " $5 " used, " $4 " free" }' >&2
echo "services: PostgreSQL, MariaDB, Redis and RabbitMQ are up" >&2
