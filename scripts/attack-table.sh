#!/usr/bin/env bash
# The front door's figures in one run, on the release binary:
#  1. every attack of scripts/attack-bench.py (slow heads from 200 addresses, slow bodies,
#     clients that never read, slow heads from one address, a challenge flood from new addresses)
#     against attestd with its default defences, a legitimate client once a second doing
#     GET /healthz and a fresh install's whole token exchange: success, p50/p99, peak RSS;
#  2. what the defences cost in normal throughput: `attest-sim load` against two attestd on the
#     same database, defences on (defaults; rate limits raised so the load is not refused, but
#     still counted) and off (deadlines at their maximum, no per-address or rate limits),
#     interleaved in rounds.
# usage: scripts/attack-table.sh [SECONDS=30] [CONNECTIONS=5000] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30} connections=${2:-5000} rounds=${3:-3}
bin=${BIN:-.build/release}  # BIN: another build's directory, to compare
[ -x $bin/attestd ] && [ -x $bin/attestctl ] && [ -x $bin/attest-sim ] || swift build -c release >/dev/null
ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d /tmp/attack-table.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
db=$work/attestd.sqlite
$bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
  --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
serve() {  # serve PORT OPTION… → pid in $served
  $bin/attestd serve --db "$db" --admin-listen 127.0.0.1:0 --listen "127.0.0.1:$1" --trust-anchor Fixtures/test-authority/root.pem "${@:2}" 2>>"$work/attestd.log" &
  served=$!
  pids+=("$served")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/healthz" >/dev/null && break; sleep 0.05; done
}

echo "== attacks: $connections connections (flood: new addresses), $seconds s each, attestd with default defences"
port=$(free_port)
# The legitimate client is a fresh install every second, all from one address: over the
# per-address registration limit (20 an hour) after 20 s, so that limit is lifted here.
serve "$port" $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0)
CLIENT_ID=$clid python3 scripts/attack-bench.py "$port" all "$connections" "$seconds" "$served"
kill "$served"; wait "$served" 2>/dev/null || true

echo "== what the defences cost: attest-sim load (16 devices, 10 s) in $rounds rounds"
on=$(free_port) off=$(free_port)
serve "$on" --mint-limit 1000000 --registration-quota 100000000 --challenge-limit 100000000 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 100000000)
serve "$off" --mint-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) --challenge-limit 0 --head-deadline 600 --min-body-rate 0 \
  --write-timeout 3600 --max-connections-per-ip 0
declare -A rate
for round in $(seq "$rounds"); do
  for target in on off; do
    url="http://127.0.0.1:${!target}"
    r=$($bin/attest-sim load --base-url "$url" --client-id "$clid" --devices 16 --seconds 10 | awk '$1 == "token_exchanges_per_second:" {print $2}')
    echo "round $round defences $target: $r exchanges/s"
    rate[$target]+="$r "
  done
done
median() { python3 -c 'import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))' $1; }
python3 -c 'import sys; print(f"median exchanges/s: defences on {float(sys.argv[1]):.0f}, off {float(sys.argv[2]):.0f}: on/off {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rate[on]}")" "$(median "${rate[off]}")"
