#!/usr/bin/env bash
# Token exchanges per second with 64 simulated devices, in one run:
#   SQLite, one attestd;  PostgreSQL, one attestd;  PostgreSQL, two attestd (the load generator
#   spreads its workers over both base URLs, round-robin, as a load balancer would).
# Prints attest-sim load's figures for each, and PostgreSQL's statements per exchange.
#
# usage: scripts/scaleout-bench.sh [SECONDS=10] [DEVICES=64]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10} devices=${2:-64}
bin=${BIN:-.build/release}  # BIN: another build's directory, to compare
[ -x $bin/attestd ] && [ -x $bin/attestctl ] && [ -x $bin/attest-sim ] || swift build -c release >/dev/null

work=$(mktemp -d /tmp/scaleout-bench.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/pg-test-cluster.sh stop "$work/pg" >/dev/null 2>&1 || true
  cp "$work/attestd.log" /tmp/scaleout-attestd.log 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap - ERR
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mkdir -p "$work/pg"
scripts/pg-test-cluster.sh start "$work/pg" >/dev/null
pg_url="postgresql://attest:attest-test-password@127.0.0.1:$(cat "$work/pg/port")/attest"

setup() {  # setup DB → client ID
  $bin/attestctl init --db "$1" --secrets-key-file "$work/attestd.key" --owner bench@example.com >/dev/null
  $bin/attestctl integrations create --db "$1" --actor bench@example.com --name Bench --team-id ABCDE12345 \
    --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])'
}
start() {  # start DB: sets $port (not in a subshell, so the process is tracked for cleanup)
  port=$(free_port)
  $bin/attestd serve --db "$1" --admin-listen 127.0.0.1:0 --listen "127.0.0.1:$port" --trust-anchor Fixtures/test-authority/root.pem \
    --secrets-key-file "$work/attestd.key" --mint-limit 0 --challenge-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) 2>>"$work/attestd.log" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
}
statements() {  # PostgreSQL statements executed so far in the attest database
  psql "$pg_url" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = 'attest'" 2>/dev/null || echo 0
}
report() { grep -E "token_exchanges_per_second|latency_ms_p50|latency_ms_p99|failed|status_" | sed "s/^/  $1: /"; }

sqlite_clid=$(setup "$work/bench.sqlite")
start "$work/bench.sqlite"
echo "SQLite, one instance ($devices devices, $seconds s):"
$bin/attest-sim load --base-url "http://127.0.0.1:$port" --client-id "$sqlite_clid" --devices "$devices" --seconds "$seconds" | report sqlite
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

pg_clid=$(setup "$pg_url")
start "$pg_url"; port1=$port
echo "PostgreSQL, one instance:"
before=$(statements)
$bin/attest-sim load --base-url "http://127.0.0.1:$port1" --client-id "$pg_clid" --devices "$devices" --seconds "$seconds" > "$work/one.txt"
after=$(statements)
report postgres-1 < "$work/one.txt"
exchanges=$(awk '/^token_exchanges:/ {print $2}' "$work/one.txt"); registrations=$(awk '/^registrations:/ {print $2}' "$work/one.txt")
python3 -c 'import sys; c=int(sys.argv[2])-int(sys.argv[1]); n=int(sys.argv[3])+int(sys.argv[4]); print(f"  postgres-1: {c} transactions committed for {n} registrations + exchanges ({c/max(n,1):.2f} each, challenges included)")' \
  "$before" "$after" "$exchanges" "$registrations"
start "$pg_url"; port2=$port
echo "PostgreSQL, two instances, round-robin:"
$bin/attest-sim load --base-url "http://127.0.0.1:$port1,http://127.0.0.1:$port2" --client-id "$pg_clid" --devices "$devices" \
  --seconds "$seconds" | report postgres-2
