#!/usr/bin/env bash
# scripts/upgrade-check.sh OLD_COMMIT — docs/deploying.md's "Upgrading, and going back", run from
# OLD_COMMIT's build to this tree's, with simulated devices exchanging tokens the whole time:
#   SQLite:     one attestd;  PostgreSQL: two attestd on one database (a throwaway cluster).
# For each: the old release serves and the devices register; backup (attestctl backup, pg_dump);
# stop; the new attestctl migrate; start the new release; /readyz and --version; the devices keep
# refreshing the tokens and keys they had. Then the way back: the old release refuses the migrated
# database; the backup restored, the old release serves again and new devices register.
# Prints what each step saw and the load's figures (exchanges, failures: only while stopped).
#
# OLD_COMMIT is built once in /tmp/attestd-upgrade-OLD (git archive, swift build -c release), kept
# for the next run. This tree: make release. CI does not run it (it builds another release).
#   DEVICES=16 SECONDS_UNDER_LOAD=40 scripts/upgrade-check.sh 8d8b214
set -euo pipefail
cd "$(dirname "$0")/.."
old_commit=${1:?usage: scripts/upgrade-check.sh OLD_COMMIT}
old_commit=$(git rev-parse --short "$old_commit^{commit}")
devices=${DEVICES:-16} seconds=${SECONDS_UNDER_LOAD:-40}
root=$PWD

old_tree=/tmp/attestd-upgrade-$old_commit/tree
if [ ! -x "$old_tree/.build/release/attestd" ] || [ ! -x "$old_tree/.build/release/attestctl" ]; then
  echo "building $old_commit in $old_tree (once)"
  rm -rf "$old_tree" && mkdir -p "$old_tree"
  git archive "$old_commit" | tar -x -C "$old_tree"
  (cd "$old_tree" && swift build -c release --product attestd >/dev/null && swift build -c release --product attestctl >/dev/null)
fi
make --no-print-directory release >/dev/null
old=$old_tree/.build/release new=$root/.build/release sim=$root/.build/release/attest-sim
echo "old: $($old/attestd --version 2>/dev/null || echo "attestd $old_commit (no --version)")"
echo "new: $($new/attestd --version)"

work=$(mktemp -d /tmp/upgrade-check.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/pg-test-cluster.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
check() {  # check DESCRIPTION COMMAND…: runs it, says ok or FAIL
  if "${@:2}" >"$work/check.out" 2>&1; then echo "  ok    $1"; else echo "  FAIL  $1: $(tail -3 "$work/check.out" | tr '\n' ' ')"; failed=1; fi
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
key=$work/attestd.key

# serve BIN DB PORT ADMIN_PORT NAME: an attestd as the unit runs it, with the test authority trusted and
# the per-device limits off (the load generator is many devices from one address); its PID in $served.
serve() {
  local extra=()
  "$1/attestd" serve --help 2>&1 | grep -q registration-limit-per-address && extra=(--registration-limit-per-address 0)
  "$1/attestd" serve --db "$2" --listen "127.0.0.1:$3" --admin-listen "127.0.0.1:$4" --secrets-key-file "$key" \
    --trust-anchor "$root/Fixtures/test-authority/root.pem" --trusted-proxy 127.0.0.1/32 --max-connections-per-ip 0 --shutdown-grace 10 \
    --mint-limit 0 --challenge-limit 0 --registration-quota 0 "${extra[@]}" 2>>"$work/$5.log" &
  served=$!
  pids+=("$served")
}
ready() {  # ready PORT: /readyz answers 200 within 30 s
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/readyz" >/dev/null && return 0; sleep 0.05; done
  return 1
}
stop() {  # stop PID: SIGTERM, as systemctl stop does, and wait for it
  kill -TERM "$1"; wait "$1" 2>/dev/null || true
}
registered() {  # registered ADMIN_PORT…: registrations so far, summed over instances
  for port in "$@"; do curl -sf "http://127.0.0.1:$port/metrics" | awk '/^attestd_registrations_total/ {s += $NF} END {print s + 0}'; done \
    | awk '{s += $1} END {print s + 0}'
}
wait_registered() {  # wait_registered N ADMIN_PORT…: the load's devices have all registered
  local n=$1; shift
  for _ in $(seq 1200); do [ "$(registered "$@")" -ge "$n" ] && return 0; sleep 0.05; done
  return 1
}
refuses_newer() {  # refuses_newer DB LOG: the old attestd will not start on the migrated database
  local port; port=$(free_port)
  if timeout 20 "$old/attestd" serve --db "$1" --listen "127.0.0.1:$port" --admin-listen none --secrets-key-file "$key" 2>"$2"; then return 1; fi
  grep -q "newer version" "$2"
}
report() { grep -E "^(registrations|registration_failures|token_exchanges|failed_exchanges|transport_errors|other_errors|status_[0-9]+):" "$1" | tr '\n' ' '; echo; }
refreshed() {  # refreshed ADMIN_PORT: tokens this instance issued for an assertion (a device's refresh)
  test "$(curl -sf "http://127.0.0.1:$1/metrics" | awk '/^attestd_tokens_issued_total\{grant="assertion"\}/ {s += $NF} END {print s + 0}')" -gt 0
}

# ---- SQLite: one instance ----
echo "SQLite, one attestd, $devices devices exchanging for $seconds s:"
db=$work/attestd.sqlite port=$(free_port) admin=$(free_port)
"$old/attestctl" init --db "$db" --secrets-key-file "$key" --owner ops@example.com >/dev/null
clid=$("$old/attestctl" integrations create --db "$db" --secrets-key-file "$key" --actor ops@example.com --name App --team-id ABCDE12345 \
       --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
serve "$old" "$db" "$port" "$admin" sqlite-old; old_pid=$served
check "the old release is ready" ready "$port"
"$sim" load --base-url "http://127.0.0.1:$port" --client-id "$clid" --devices "$devices" --seconds "$seconds" >"$work/sqlite-load.txt" 2>&1 &
load=$!; pids+=("$load")
check "the devices registered with the old release" wait_registered "$devices" "$admin"
check "backup (attestctl backup, online)" "$old/attestctl" backup --db "$db" --to "$work/before-upgrade.sqlite"
started=$(date +%s.%N)
stop "$old_pid"
check "migrate (the new attestctl)" "$new/attestctl" migrate --db "$db" --secrets-key-file "$key"
serve "$new" "$db" "$port" "$admin" sqlite-new; new_pid=$served
check "the new release is ready (/readyz 200)" ready "$port"
echo "  down  $(python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.2f} s')" "$started") from stop to ready"
check "the new release says its version" grep -q "\"version\":\"$($new/attestd --version | awk '{print $2}')\"" "$work/sqlite-new.log"
wait "$load" || true
echo "  load  $(report "$work/sqlite-load.txt")"
check "devices registered before refreshed with the new release (keys and counters carried over)" refreshed "$admin"
stop "$new_pid"
check "the old release refuses the migrated database" refuses_newer "$db" "$work/sqlite-refused.log"
rm -f "$db-wal" "$db-shm"
install -m 0600 "$work/before-upgrade.sqlite" "$db"
serve "$old" "$db" "$port" "$admin" sqlite-back; back_pid=$served
check "rolled back: the old release is ready on the backup" ready "$port"
"$sim" load --base-url "http://127.0.0.1:$port" --client-id "$clid" --devices 4 --seconds 2 >"$work/sqlite-after.txt" 2>&1 || true
check "rolled back: new devices register and exchange, no failures" grep -q "^result: ok$" "$work/sqlite-after.txt"
stop "$back_pid"

# ---- PostgreSQL: two instances on one database ----
echo "PostgreSQL, two attestd on one database, $devices devices over both for $seconds s:"
mkdir -p "$work/pg"
scripts/pg-test-cluster.sh start "$work/pg" >/dev/null
url="postgresql://attest:attest-test-password@127.0.0.1:$(cat "$work/pg/port")/attest"
"$old/attestctl" init --db "$url" --secrets-key-file "$key" --owner ops@example.com >/dev/null
clid=$("$old/attestctl" integrations create --db "$url" --secrets-key-file "$key" --actor ops@example.com --name App --team-id ABCDE12345 \
       --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
port1=$(free_port) admin1=$(free_port) port2=$(free_port) admin2=$(free_port)
serve "$old" "$url" "$port1" "$admin1" pg-old-1; old1=$served
serve "$old" "$url" "$port2" "$admin2" pg-old-2; old2=$served
check "the old release is ready on both" bash -c "$(declare -f ready); ready $port1 && ready $port2"
"$sim" load --base-url "http://127.0.0.1:$port1,http://127.0.0.1:$port2" --client-id "$clid" --devices "$devices" --seconds "$seconds" \
  >"$work/pg-load.txt" 2>&1 &
load=$!; pids+=("$load")
check "the devices registered with the old release" wait_registered "$devices" "$admin1" "$admin2"
check "backup (pg_dump -Fc, online)" pg_dump -Fc -f "$work/before-upgrade.dump" "$url"
started=$(date +%s.%N)
stop "$old1"; stop "$old2"
check "migrate once (the new attestctl)" "$new/attestctl" migrate --db "$url" --secrets-key-file "$key"
serve "$new" "$url" "$port1" "$admin1" pg-new-1; new1=$served
check "the first new instance is ready" ready "$port1"
serve "$new" "$url" "$port2" "$admin2" pg-new-2; new2=$served
check "the second new instance is ready" ready "$port2"
echo "  down  $(python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.2f} s')" "$started") from stop to both ready"
wait "$load" || true
echo "  load  $(report "$work/pg-load.txt")"
check "devices registered before refreshed with both new instances" bash -c "$(declare -f refreshed); refreshed $admin1 && refreshed $admin2"
stop "$new1"; stop "$new2"
check "the old release refuses the migrated database" refuses_newer "$url" "$work/pg-refused.log"
# The way back: the database as dumped, in an empty schema (pg_restore --clean would keep the tables
# the new release added, and its migration would then fail at the next upgrade).
check "restore: an empty schema" psql "$url" -v ON_ERROR_STOP=1 -q -c "DROP SCHEMA public CASCADE" -c "CREATE SCHEMA public"
check "restore: pg_restore" pg_restore --no-owner -d "$url" "$work/before-upgrade.dump"
serve "$old" "$url" "$port1" "$admin1" pg-back-1; back1=$served
serve "$old" "$url" "$port2" "$admin2" pg-back-2; back2=$served
check "rolled back: the old release is ready on both" bash -c "$(declare -f ready); ready $port1 && ready $port2"
"$sim" load --base-url "http://127.0.0.1:$port1,http://127.0.0.1:$port2" --client-id "$clid" --devices 4 --seconds 2 >"$work/pg-after.txt" 2>&1 || true
check "rolled back: new devices register and exchange, no failures" grep -q "^result: ok$" "$work/pg-after.txt"
stop "$back1"; stop "$back2"
# Forward again from the restored database: the new release's migrations apply cleanly a second time.
check "upgrade again after the rollback: migrate" "$new/attestctl" migrate --db "$url" --secrets-key-file "$key"

[ "$failed" = 0 ] && echo "upgrade-check: the procedure held, from $old_commit to $(git rev-parse --short HEAD)" || { echo "upgrade-check: FAILED"; exit 1; }
