#!/usr/bin/env bash
# The Messages relay against what an operator would otherwise deploy: nginx proxy_pass in front
# of the API, rewriting the auth header, with a keepalive pool to the upstream. In one run,
# interleaved in rounds so a noisy machine hits all three alike:
#   direct  — wrk → the fast upstream (nginx answering a fixed Messages reply)
#   nginx   — wrk → nginx proxy_pass (x-api-key set, Authorization dropped) → upstream
#   attestd — wrk → attestd (token check + relay + usage ledger + the integration's policy) → upstream
#   attestd-noledger — the same attestd without ledger and policy (--no-usage-ledger): their cost
# Small non-streaming requests at C connections; prints requests/s and p50/p99 per round and the
# medians, the ratios attestd/nginx and ledger on/off, and the time to first byte of a stream (upstream-stub)
# direct and through attestd.
#
# usage: scripts/relay-bench.sh [SECONDS_PER_RUN=5] [ROUNDS=3] [CONNECTIONS=64]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5} rounds=${2:-3} connections=${3:-64}
bin=.build/release

need() { command -v "$1" >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null; } || { echo "relay-bench: needs $2 (apt-get install $2)" >&2; exit 1; }; }
need nginx nginx-light
need wrk wrk
need curl curl
[ -x $bin/attestd ] && [ -x $bin/attestctl ] && [ -x $bin/attest-sim ] && [ -x $bin/upstream-stub ] || swift build -c release >/dev/null

work=$(mktemp -d /tmp/relay-bench.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
upstream_port=$(free_port) proxy_port=$(free_port)
key="bench-key-not-a-real-key-0000000000"
reply='{"id":"msg_bench","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}'

# One nginx process serves both the fixed upstream and the proxy (two server blocks).
mkdir -p "$work/nginx"
cat > "$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
daemon on;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body; proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi; uwsgi_temp_path $work/nginx/uwsgi; scgi_temp_path $work/nginx/scgi;
  keepalive_requests 1000000;
  upstream messages { server 127.0.0.1:$upstream_port; keepalive 64; }
  server {
    listen 127.0.0.1:$upstream_port;
    location / { default_type application/json; add_header request-id req_bench; return 200 '$reply'; }
  }
  server {
    listen 127.0.0.1:$proxy_port;
    location / {
      proxy_pass http://messages;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_set_header x-api-key "$key";
      proxy_buffering off;
    }
  }
}
EOF
nginx -c "$work/nginx.conf" -p "$work/nginx"

# attestd on the same upstream, with the key as the service default; limits off for load.
db="$work/attestd.sqlite"
$bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
  --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
# Every policy check active (an allowed model, a max_tokens ceiling, per-device and monthly limits
# too high to bind), so the run measures what they cost, not what they refuse.
$bin/attestctl integrations update "$clid" --db "$db" --actor bench@example.com --models claude-bench --max-tokens 4096 \
  --device-requests-per-minute 1000000000 --monthly-token-budget 1000000000000000 >/dev/null
echo "$key" > "$work/upstream.key"
attestd_port=$(free_port) noledger_port=$(free_port)
serve() {  # serve PORT [OPTION…]: attestd on the fixed upstream, exchange limits off for load
  $bin/attestd serve --db "$db" --listen "127.0.0.1:$1" --trust-anchor Fixtures/test-authority/root.pem \
    --upstream-url "http://127.0.0.1:$upstream_port" --upstream-key-file "$work/upstream.key" \
    --mint-limit 0 --challenge-limit 0 --registration-quota 0 ${THREADS:+--threads "$THREADS"} "${@:2}" 2>>"$work/attestd.log" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/healthz" >/dev/null && break; sleep 0.05; done
}
serve "$attestd_port"
attestd_pid=${pids[-1]}
serve "$noledger_port" --no-usage-ledger
noledger_pid=${pids[-1]}

# A real token from a simulated device (the device's state file holds it; the tool never prints it).
$bin/attest-sim simulate-device --base-url "http://127.0.0.1:$attestd_port" --client-id "$clid" --state-dir "$work/device" \
  --app-id ABCDE12345.com.example.app >/dev/null
token=$(python3 -c 'import json,sys,glob; print(json.load(open(glob.glob(sys.argv[1]+"/client-*.json")[0]))["token"]["token"])' "$work/device")

cat > "$work/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}'
wrk.headers["content-type"] = "application/json"
wrk.headers["anthropic-version"] = "2023-06-01"
wrk.headers["authorization"] = "Bearer $token"
EOF

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
printf '%-6s %-16s %10s %9s %9s %7s\n' round target req/s p50_ms p99_ms non2xx
declare -A rps p50 p99
for round in $(seq "$rounds"); do
  for target in direct nginx attestd attestd-noledger; do
    case $target in
      direct) url="http://127.0.0.1:$upstream_port/v1/messages" ;;
      nginx) url="http://127.0.0.1:$proxy_port/v1/messages" ;;
      attestd) url="http://127.0.0.1:$attestd_port/v1/messages" ;;
      attestd-noledger) url="http://127.0.0.1:$noledger_port/v1/messages" ;;
    esac
    read -r r a b n < <(run "$target" "$url")
    printf '%-6s %-16s %10s %9s %9s %7s\n' "$round" "$target" "$r" "$a" "$b" "$n"
    rps[$target]+="$r " p50[$target]+="$a " p99[$target]+="$b "
  done
done
median() { python3 -c 'import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))' $1; }
for target in direct nginx attestd attestd-noledger; do
  echo "median $target: $(median "${rps[$target]}") req/s, p50 $(median "${p50[$target]}") ms, p99 $(median "${p99[$target]}") ms"
done
python3 -c 'import sys; print(f"attestd/nginx requests per second: {float(sys.argv[1])/float(sys.argv[2]):.2f}")' \
  "$(median "${rps[attestd]}")" "$(median "${rps[nginx]}")"
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
$bin/attestd serve --db "$db" --listen "127.0.0.1:$attestd_port" --trust-anchor Fixtures/test-authority/root.pem \
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
