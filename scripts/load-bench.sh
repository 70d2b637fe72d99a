#!/usr/bin/env bash
# Load benchmark: a release attestd (test authority trusted, limits off) on a scratch database,
# driven by `attest-sim load` at each concurrency given; prints the load generator's figures and
# both processes' CPU seconds over the run. Usage: scripts/load-bench.sh [SECONDS] [DEVICES…]
# Environment: SYNC=full|normal (attestd --synchronous), THREADS (attestd --threads).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}; shift || true
counts=("${@:-8 64}")
[ $# -eq 0 ] && counts=(8 64)
bin=${BIN:-.build/release}  # BIN: another build's directory, to compare
[ -x $bin/attestd ] && [ -x $bin/attestctl ] && [ -x $bin/attest-sim ] || swift build -c release
dir=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$dir"' EXIT
db=$dir/load.sqlite
$bin/attestctl init --db "$db" --owner load@example.com >/dev/null
clid=$($bin/attestctl integrations create --db "$db" --actor load@example.com --name Load --team-id ABCDE12345 \
       --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
$bin/attestd serve --db "$db" --admin-listen 127.0.0.1:0 --listen 127.0.0.1:0 --trust-anchor Fixtures/test-authority/root.pem \
    --mint-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) --challenge-limit 0 --synchronous "${SYNC:-full}" ${THREADS:+--threads "$THREADS"} \
    2> "$dir/server.log" &
server=$!
for _ in $(seq 100); do grep -q '"event":"listening"' "$dir/server.log" 2>/dev/null && break; sleep 0.1; done
port=$(grep '"event":"listening"' "$dir/server.log" | grep -o '"address":"127.0.0.1:[0-9]*"' | grep -o '[0-9]*"$' | tr -d '"')
cpu() { awk '{print ($14+$15)/100}' /proc/$server/stat; }
ticks=$(getconf CLK_TCK); [ "$ticks" = 100 ] || echo "note: CLK_TCK=$ticks"
for n in "${counts[@]}"; do
  echo "== $n devices, $seconds s, attestd --synchronous ${SYNC:-full} --threads ${THREADS:-default}"
  before=$(cpu)
  $bin/attest-sim load --base-url "http://127.0.0.1:$port" --client-id "$clid" --devices "$n" --seconds "$seconds"
  after=$(cpu)
  echo "server_cpu_seconds: $(python3 -c "print(round($after-$before,2))") (registration phase included)"
done
