#!/usr/bin/env bash
# The Messages relay against what an operator would otherwise deploy: nginx proxy_pass in front
# of the API, rewriting the auth header, with a keepalive pool to the upstream. In one run,
# interleaved in rounds so a noisy machine hits them all alike:
#   direct  — wrk → the fast upstream (nginx answering a fixed Messages reply)
#   nginx   — wrk → nginx proxy_pass (x-api-key set, Authorization dropped) → upstream
#   curl-floor — wrk → scripts/curl-floor.c, a bare C relay on libcurl's multi interface with as many
#             threads as attestd has loops: the most any relay built on libcurl can reach here
#   attestd — wrk → attestd (token check + relay + usage ledger + the integration's policy) → upstream
#   attestd-noledger — the same attestd without ledger and policy (--no-usage-ledger): their cost
#   nginx-auth — nginx as the data plane with auth_request to attestd's /v1/authz/check (docs/token-check-for-a-proxy.md's
#             configuration), then proxy_pass as in "nginx"
# For each, the CPU per request of the processes doing the work (nginx's worker, attestd), less
# the upstream's own share (the fixed reply is served by the same nginx worker: its CPU per
# request in the direct run).
# Small non-streaming requests at C connections; prints requests/s and p50/p99 per round and the
# medians, the ratios attestd/nginx, curl-floor/nginx, attestd/curl-floor and ledger on/off, and the time to first byte of a stream (upstream-stub)
# direct and through attestd.
#
# usage: scripts/relay-bench.sh [SECONDS_PER_RUN=5] [ROUNDS=3] [CONNECTIONS=64]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5} rounds=${2:-3} connections=${3:-64}
fixture_name=relay-bench
source scripts/relay-fixture.sh
attestd_port=$(free_port) noledger_port=$(free_port)
serve "$attestd_port"
attestd_pid=${pids[-1]}
serve "$noledger_port" --no-usage-ledger
noledger_pid=${pids[-1]}
mint_token "$attestd_port"
floor_port=$(free_port)
serve_floor "$floor_port" "${THREADS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}"

nginx_worker=$(pgrep -P "$(cat "$work/nginx.pid")" | head -1)
cpu_ticks() {  # cpu_ticks PID… → user+system clock ticks of those processes, summed
  for p in "$@"; do awk '{print $14 + $15}' "/proc/$p/stat"; done | awk '{s += $1} END {print s}'
}
run() {  # run NAME URL → "rps p50_ms p99_ms"
  wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "$2" 2>&1 | tee "$work/wrk-$1.txt" | python3 -c '
import re, sys
text = sys.stdin.read()
def ms(v):
    m = re.fullmatch(r"([\d.]+)([a-z]*)", v)
    if not m: sys.exit("relay-bench: cannot read wrk output:\n" + text)
    return float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000, "": 1000}[m.group(2)]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p50 = ms(re.search(r"^\s*50%\s+(\S+)", text, re.M).group(1)); p99 = ms(re.search(r"^\s*99%\s+(\S+)", text, re.M).group(1))
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
print(f"{rps:.0f} {p50:.3f} {p99:.3f} {non2xx.group(1) if non2xx else 0}")'
}

echo "relay bench: $seconds s per run, $rounds rounds, $connections connections, attestd threads ${THREADS:-as attestd defaults (one per core)}"
printf '%-6s %-16s %10s %9s %9s %7s %8s\n' round target req/s p50_ms p99_ms non2xx cpu_us
targets="direct nginx nginx-auth curl-floor attestd attestd-noledger"
ticks_per_second=$(getconf CLK_TCK)
declare -A rps p50 p99 cpu
for round in $(seq "$rounds"); do
  for target in $targets; do
    case $target in
      direct) url="http://127.0.0.1:$upstream_port/v1/messages"; busy="$nginx_worker" ;;
      nginx) url="http://127.0.0.1:$proxy_port/v1/messages"; busy="$nginx_worker" ;;
      nginx-auth) url="http://127.0.0.1:$auth_port/v1/messages"; busy="$nginx_worker $attestd_pid" ;;
      curl-floor) url="http://127.0.0.1:$floor_port/v1/messages"; busy="$nginx_worker ${pids[-1]}" ;;
      attestd) url="http://127.0.0.1:$attestd_port/v1/messages"; busy="$nginx_worker $attestd_pid" ;;
      attestd-noledger) url="http://127.0.0.1:$noledger_port/v1/messages"; busy="$nginx_worker $noledger_pid" ;;
    esac
    before=$(cpu_ticks $busy)
    read -r r a b n < <(run "$target" "$url")
    after=$(cpu_ticks $busy)
    # CPU µs per request of the processes serving this target (the upstream's share included).
    c=$(python3 -c 'import sys; t,tps,rps,s=map(float,sys.argv[1:]); print(f"{t/tps*1e6/max(1,rps*s):.1f}")' "$((after - before))" "$ticks_per_second" "$r" "$seconds")
    printf '%-6s %-16s %10s %9s %9s %7s %8s\n' "$round" "$target" "$r" "$a" "$b" "$n" "$c"
    rps[$target]+="$r " p50[$target]+="$a " p99[$target]+="$b " cpu[$target]+="$c "
  done
done
median() { python3 -c 'import statistics,sys; print(round(statistics.median(map(float, sys.argv[1:])), 3))' $1; }
upstream_cpu=$(median "${cpu[direct]}")
for target in $targets; do
  own=$(python3 -c 'import sys; print(f"{float(sys.argv[1])-float(sys.argv[2]):.1f}")' "$(median "${cpu[$target]}")" "$upstream_cpu")
  echo "median $target: $(median "${rps[$target]}") req/s, p50 $(median "${p50[$target]}") ms, p99 $(median "${p99[$target]}") ms, CPU $(median "${cpu[$target]}") µs/request ($own µs without the upstream's)"
done
python3 -c 'import sys; print(f"nginx-auth/nginx requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}; attestd/nginx-auth: {float(sys.argv[3])/float(sys.argv[1]):.2f}")' \
  "$(median "${rps[nginx-auth]}")" "$(median "${rps[nginx]}")" "$(median "${rps[attestd]}")"
python3 -c 'import sys; print(f"attestd/nginx requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rps[attestd]}")" "$(median "${rps[nginx]}")"
python3 -c 'import sys; print(f"curl-floor/nginx requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rps[curl-floor]}")" "$(median "${rps[nginx]}")"
python3 -c 'import sys; print(f"attestd/curl-floor requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rps[attestd]}")" "$(median "${rps[curl-floor]}")"
python3 -c 'import sys; print(f"ledger and policy on/off requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rps[attestd]}")" "$(median "${rps[attestd-noledger]}")"
# Every request the ledger-on instance answered was recorded (after its last flush).
sleep 1.5
recorded=$($bin/attestctl usage --db "$db" --client-id "$clid" --json | python3 -c 'import json,sys; print(sum(json.loads(l)["requests"] for l in sys.stdin))')
echo "requests in the usage ledger: $recorded"

# Time to first byte of a stream: the stub directly, and through attestd (token check + relay).
$bin/upstream-stub --api-key "$key" --deltas 5 --delta-interval-ms 50 > "$work/stub.json" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/stub.json" ] && break; sleep 0.05; done
stub_port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$work/stub.json")
kill "$attestd_pid" "$noledger_pid"; wait "$attestd_pid" "$noledger_pid" 2>/dev/null || true
$bin/attestd serve --db "$db" --listen "127.0.0.1:$attestd_port" --admin-listen 127.0.0.1:0 --trust-anchor Fixtures/test-authority/root.pem \
  --upstream-url "http://127.0.0.1:$stub_port" --upstream-key-file "$work/upstream.key" 2>>"$work/attestd.log" &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$attestd_port/healthz" >/dev/null && break; sleep 0.05; done
body='{"model":"claude-bench","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hi"}]}'
ttfb() {  # ttfb URL HEADER… → median seconds to the first byte over 50 requests
  for _ in $(seq 50); do
    curl -s -o /dev/null -w '%{time_starttransfer}\n' -X POST "$1" -H 'content-type: application/json' "${@:2}" -d "$body"
  done | python3 -c 'import statistics,sys; print(f"{statistics.median(float(l) for l in sys.stdin)*1000:.2f}")'
}
direct_ttfb=$(ttfb "http://127.0.0.1:$stub_port/v1/messages" -H "x-api-key: $key")
relay_ttfb=$(ttfb "http://127.0.0.1:$attestd_port/v1/messages" -H "authorization: Bearer $token")
echo "stream time to first byte (median of 50): direct ${direct_ttfb} ms, through attestd ${relay_ttfb} ms"
python3 -c 'import sys; print(f"added by the relay: {float(sys.argv[2])-float(sys.argv[1]):.2f} ms")' "$direct_ttfb" "$relay_ttfb"
