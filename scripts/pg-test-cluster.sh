#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and local runs, all inside DIR:
#   scripts/pg-test-cluster.sh start DIR   initdb (first time), start; prints the connection URL
#   scripts/pg-test-cluster.sh halt DIR    stop the server, keep the data (an outage, for tests)
#   scripts/pg-test-cluster.sh stop DIR    stop the server and delete DIR
# It listens on 127.0.0.1:$PORT (a free port unless PORT is set) with password authentication
# and on a Unix socket in DIR with trust. It creates the non-superuser role `attest` (password
# `attest-test-password`) owning the database `attest`: what the store needs, and no more.
# PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user.
set -euo pipefail

command=${1:-}
dir=${2:-}
if [[ -z "$command" || -z "$dir" ]]; then
  echo "usage: $0 start|halt|stop DIR" >&2
  exit 2
fi

pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}
if [[ ! -x "$pgbin/initdb" ]]; then
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
fi
if [[ -z "$pgbin" || ! -x "$pgbin/initdb" ]]; then
  echo "pg-test-cluster: no initdb under /usr/lib/postgresql/*/bin: install the postgresql package (make deps)" >&2
  exit 1
fi

as_owner() {
  if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

server_stop() {  # server_stop MODE
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    # A test may have frozen the server (SIGSTOP) and died before thawing it: a stopped
    # process acts on no other signal, so continue the postmaster and its children first.
    pid=$(head -1 "$dir/data/postmaster.pid" 2>/dev/null || true)
    if [[ -n "$pid" ]]; then
      kill -CONT "$pid" 2>/dev/null || true
      pkill -CONT -P "$pid" 2>/dev/null || true
    fi
    if ! as_owner "$pgbin/pg_ctl" -D "$dir/data" -m "$1" -w -t 20 stop >/dev/null 2>&1; then
      # Still there after pg_ctl: end the postmaster named in its pid file (ours, in DIR).
      pid=$(head -1 "$dir/data/postmaster.pid" 2>/dev/null || true)
      if [[ -n "$pid" ]]; then kill -QUIT "$pid" 2>/dev/null || true; fi
    fi
  fi
}

case "$command" in
start)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ $(id -u) == 0 ]]; then chown postgres: "$dir"; fi
  if [[ ! -f "$dir/data/PG_VERSION" ]]; then
    as_owner "$pgbin/initdb" -D "$dir/data" -U postgres -E UTF8 --no-locale --no-sync \
      --auth-local=trust --auth-host=scram-sha-256 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    cat >>"$dir/data/postgresql.conf" <<EOF
# pg-test-cluster.sh: throwaway settings, durability traded for speed
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
include_if_exists = 'port.conf'
EOF
    cat >"$dir/data/pg_hba.conf" <<EOF
local all all trust
host  all all 127.0.0.1/32 scram-sha-256
EOF
    created=1
  fi
  # A free port below the ephemeral range; another process may still take it between our check
  # and the server's bind, so a new cluster tries another. A restart after `halt` keeps its port.
  for attempt in 1 2 3 4 5 6 7 8; do
    if [[ -z "${created:-}" ]]; then
      port=$(cat "$dir/port")
    else
      port=${PORT:-}
      while [[ -z "$port" ]]; do
        candidate=$((15000 + RANDOM % 17000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; fi
      done
      echo "port = $port" >"$dir/port.conf.tmp"
      as_owner cp "$dir/port.conf.tmp" "$dir/data/port.conf"
      rm -f "$dir/port.conf.tmp"
      echo "$port" >"$dir/port"
    fi
    if as_owner "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start >/dev/null; then
      break
    fi
    if [[ $attempt == 8 || -z "${created:-}" || -n "${PORT:-}" ]] || ! grep -q "Address already in use" "$dir/postgres.log"; then
      echo "pg-test-cluster: the server did not start:" >&2
      tail -20 "$dir/postgres.log" >&2
      exit 1
    fi
  done
  if [[ -n "${created:-}" ]]; then
    "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d postgres <<'EOF'
CREATE ROLE attest LOGIN PASSWORD 'attest-test-password' NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE DATABASE attest OWNER attest;
EOF
  fi
  echo "postgresql://attest:attest-test-password@127.0.0.1:$port/attest"
  ;;
halt)
  server_stop fast
  ;;
stop)
  server_stop immediate
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|halt|stop DIR" >&2
  exit 2
  ;;
esac
