#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for the tests and prints its URL.
# Usage: .ci/postgres.sh DIR [PORT]   (stop it with: pg_ctl -D DIR/data stop)
# Without PORT it takes the first free one from 54329, and the next when the
# server cannot bind it (a port can be taken by an outgoing connection's
# local end, which a connect probe does not see).
# Installs Debian's postgresql-15 when missing. As root, the cluster runs as
# the postgres user, since initdb refuses to run as root.
set -euo pipefail
dir=$1
port=${2:-}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  sudo_=""
  [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq postgresql-15 >&2
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
as=()
if [ "$(id -u)" -eq 0 ]; then
  as=(runuser -u postgres --)
fi
mkdir -p "$dir"
[ "$(id -u)" -eq 0 ] && chown postgres "$dir"
"${as[@]}" "$bin/initdb" -D "$dir/data" -U fleet --auth=trust -E UTF8 --no-locale >/dev/null
# fsync stays on: the tests exercise crash recovery on this cluster.
start() {
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $1 -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
}
if [ -n "$port" ]; then
  start "$port"
else
  for p in $(seq 54329 54399); do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue # something listens there
    if start "$p" 2>/dev/null; then port=$p; break; fi
  done
  if [ -z "$port" ]; then
    echo "no port from 54329 to 54399 would do; the server's log:" >&2
    tail -n 20 "$dir/server.log" >&2
    exit 1
  fi
fi
echo "postgres://fleet@127.0.0.1:$port/postgres?sslmode=disable"
