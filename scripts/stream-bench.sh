#!/usr/bin/env bash
# N concurrent streaming relays, each lasting S seconds from a slow upstream (upstream-stub),
# while simulated devices do token exchanges and a client polls /healthz. Prints the exchanges'
# figures during the streams, /healthz latency, and attestd's RSS and threads before and at the
# peak, per open stream.
#
# usage: scripts/stream-bench.sh [STREAMS=1000] [STREAM_SECONDS=30]   (THREADS: attestd --threads; unset, attestd's default)
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${1:-1000} stream_seconds=${2:-30}
bin=.build/release
command -v wrk >/dev/null || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; } || { echo "needs wrk" >&2; exit 1; }
[ -x $bin/attestd ] && [ -x $bin/attest-sim ] && [ -x $bin/upstream-stub ] || swift build -c release >/dev/null
ulimit -n 65536 2>/dev/null || true

work=$(mktemp -d /tmp/stream-bench.XXXXXX)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
key="bench-key-not-a-real-key-0000000000"
echo "$key" > "$work/upstream.key"

$bin/upstream-stub --api-key "$key" --stream-seconds "$stream_seconds" > "$work/stub.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/stub.json" ] && break; sleep 0.05; done
stub_port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$work/stub.json")

db="$work/attestd.sqlite"
$bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
  --bundle-id com.example.app --device-requests-per-minute 0 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
port=$(free_port)
# Every stream comes from 127.0.0.1 here, so the per-address limit is lifted for the run.
$bin/attestd serve --db "$db" --admin-listen 127.0.0.1:0 --listen "127.0.0.1:$port" --trust-anchor Fixtures/test-authority/root.pem \
  --upstream-url "http://127.0.0.1:$stub_port" --upstream-key-file "$work/upstream.key" --max-connections-per-ip 0 \
  --mint-limit 0 --challenge-limit 0 --registration-quota 0 --registration-limit-per-address 0 ${THREADS:+--threads "$THREADS"} 2>"$work/attestd.log" &
pids+=($!)
attestd=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
$bin/attest-sim simulate-device --base-url "http://127.0.0.1:$port" --client-id "$clid" --state-dir "$work/device" \
  --app-id ABCDE12345.com.example.app >/dev/null
token=$(python3 -c 'import json,sys,glob; print(json.load(open(glob.glob(sys.argv[1]+"/client-*.json")[0]))["token"]["token"])' "$work/device")

status() { awk -v k="$1" '$1 == k":" {print $2}' /proc/$attestd/status; }
rss0=$(status VmRSS) threads0=$(status Threads)

cat > "$work/stream.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"model":"claude-bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer $token"
EOF
# Each connection holds one stream for the whole run (wrk starts a new one when one ends).
wrk -t2 -c"$streams" -d"$((stream_seconds + 5))s" --timeout "$((stream_seconds + 30))s" -s "$work/stream.lua" \
  "http://127.0.0.1:$port/v1/messages" > "$work/wrk.txt" 2>&1 &
wrk_pid=$!
sleep 5
open_streams=$(curl -s "http://127.0.0.1:$port/metrics" >/dev/null; ls /proc/$attestd/fd | wc -l)

# Meanwhile: token exchanges (8 devices) and /healthz once every 100 ms.
$bin/attest-sim load --base-url "http://127.0.0.1:$port" --client-id "$clid" --devices 8 --seconds 10 > "$work/load.txt" 2>&1 &
load_pid=$!
for _ in $(seq 100); do curl -s -o /dev/null -w '%{time_total} %{http_code}\n' "http://127.0.0.1:$port/healthz"; sleep 0.1; done > "$work/healthz.txt"
rss1=$(status VmRSS) threads1=$(status Threads)
wait "$load_pid" || true
wait "$wrk_pid" || true

echo "streams: $streams concurrent, $stream_seconds s each (fds open in attestd 5 s in: $open_streams)"
grep -E "requests in|Non-2xx|Socket errors" "$work/wrk.txt" | sed 's/^/  wrk: /'
grep -E "token_exchanges_per_second|latency_ms_p50|latency_ms_p99|latency_ms_max|failed_exchanges|status_" "$work/load.txt" | sed 's/^/  exchanges during the streams: /'
python3 - "$work/healthz.txt" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
times = sorted(float(t) * 1000 for t, _ in rows)
ok = sum(1 for _, c in rows if c == "200")
print(f"  healthz: {ok}/{len(rows)} answered 200, p50 {times[len(times)//2]:.2f} ms, p99 {times[int(len(times)*0.99)-1]:.2f} ms")
EOF
echo "  attestd RSS: ${rss0} kB before, ${rss1} kB with the streams open: $(( (rss1 - rss0) / streams )) kB per stream"
echo "  attestd threads: ${threads0} before, ${threads1} with the streams open"
