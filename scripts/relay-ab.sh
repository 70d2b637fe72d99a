#!/usr/bin/env bash
# The relay's cost per request, one build against another, in one run: both attestd processes on
# the same fixed upstream (nginx answering a Messages reply), each on its own database initialised
# by its own attestctl, measured in interleaved rounds so a noisy machine hits both alike. Prints,
# per round, requests/s, p99 and attestd's CPU per request, then the medians and the paired ratios
# (current/baseline) of requests/s and of CPU per request.
#
#   scripts/relay-ab.sh BASELINE_BIN_DIR [SECONDS_PER_RUN=5] [ROUNDS=5] [CONNECTIONS=64]
#   REQUEST=client023 scripts/relay-ab.sh /tmp/base/.build/release   # requests shaped like the client 0.2.3's
#   DBS="sqlite postgres" scripts/relay-ab.sh .build/release          # one build on SQLite against PostgreSQL
#
# PIN=1 pins attestd to core 0 and nginx and wrk to core 1 (taskset), so that the two builds'
# rounds do not differ by how the scheduler mixed the processes: far steadier CPU figures.
#
# DBS names the baseline's database, then the current build's: sqlite (default) or postgres (a
# throwaway cluster of scripts/pg-test-cluster.sh, one database each). ARGS_BASELINE and
# ARGS_CURRENT add attestd options to one side (DBS="postgres postgres" ARGS_CURRENT="--threads 2").
#
# Both integrations have every policy check on (an allowed model list with the fallback's model, a
# max_tokens ceiling, per-device and monthly limits too high to bind). The current build is
# .build/release (built when missing). A run with any non-2xx answer is reported FAILED, never as a figure.
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=${1:?usage: scripts/relay-ab.sh BASELINE_BIN_DIR [SECONDS] [ROUNDS] [CONNECTIONS]}
seconds=${2:-5} rounds=${3:-5} connections=${4:-64}
current=.build/release
[ -x $current/attestd ] || swift build -c release >/dev/null
for b in "$baseline" "$current"; do
  for tool in attestd attestctl attest-sim; do [ -x "$b/$tool" ] || { echo "relay-ab: $b/$tool is missing" >&2; exit 1; }; done
done
command -v wrk >/dev/null || { echo "relay-ab: needs wrk (apt-get install wrk)" >&2; exit 1; }

work=$(mktemp -d /tmp/relay-ab.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -d "$work/pg" ] && scripts/pg-test-cluster.sh stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

upstream_port=$(free_port)
reply='{"id":"msg_bench","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"server_tool_use":{"web_search_requests":1}}}'
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
  server {
    listen 127.0.0.1:$upstream_port;
    location / { default_type application/json; add_header request-id req_bench; return 200 '$reply'; }
  }
}
EOF
server_cpu=() client_cpu=()
if [ "${PIN:-0}" = 1 ]; then server_cpu=(taskset -c 0) client_cpu=(taskset -c 1); fi
"${client_cpu[@]}" nginx -c "$work/nginx.conf" -p "$work/nginx"
echo "bench-key-not-a-real-key-0000000000" > "$work/upstream.key"

body='{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"Hi"}]}' extra=""
if [ "${REQUEST:-}" = client023 ]; then
  body='{"cache_control":{"type":"ephemeral"},"fallbacks":[{"model":"claude-haiku-4-5"}],"max_tokens":16,"messages":[{"content":"Hi","role":"user"}],"model":"claude-bench","stream":false,"tools":[{"max_uses":3,"name":"web_search","type":"web_search_20260209"}]}'
  extra='wrk.headers["anthropic-beta"] = "feature-1,server-side-fallback-2026-06-01,user-profiles-2026-08-18"
wrk.headers["anthropic-user-profile-id"] = "uprof_bench_1"
wrk.headers["user-agent"] = "ClaudeForFoundationModels/0.2.3 (com.example.app/1.4; Swift/6.3; iOS/27.0.1)"'
fi

read -r baseline_db current_db <<<"${DBS:-sqlite sqlite}"
for kind in $baseline_db $current_db; do
  [ "$kind" = sqlite ] || [ "$kind" = postgres ] || { echo "relay-ab: DBS takes sqlite or postgres, not $kind" >&2; exit 1; }
done
pg_url=""
if [ "$baseline_db" = postgres ] || [ "$current_db" = postgres ]; then chmod 755 "$work"; pg_url=$(scripts/pg-test-cluster.sh start "$work/pg"); fi
database() {  # database NAME KIND: a SQLite file, or a database of its own on the shared cluster
  if [ "$2" = sqlite ]; then echo "$work/$1.sqlite"; return; fi
  local pgbin; pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  "$pgbin/psql" -X -q -h "$work/pg" -p "$(cat "$work/pg/port")" -U postgres -d postgres -c "CREATE DATABASE bench_$1 OWNER attest" >/dev/null
  echo "${pg_url%/attest}/bench_$1"
}

# start NAME BIN KIND: a database, an integration with every check on, attestd, a token, a wrk script.
declare -A port pid
start() {
  local name=$1 bin=$2 db extra
  db=$(database "$1" "$3")
  extra=$([ "$name" = baseline ] && echo "${ARGS_BASELINE:-}" || echo "${ARGS_CURRENT:-}")
  $bin/attestctl init --db "$db" --owner bench@example.com >/dev/null
  local clid
  clid=$($bin/attestctl integrations create --db "$db" --actor bench@example.com --name Bench --team-id ABCDE12345 \
    --bundle-id com.example.app --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["client_id"])')
  $bin/attestctl integrations update "$clid" --db "$db" --actor bench@example.com --models claude-bench,claude-haiku-4-5 --max-tokens 4096 \
    --device-requests-per-minute 1000000000 --monthly-token-budget 1000000000000000 >/dev/null
  port[$name]=$(free_port)
  "${server_cpu[@]}" $bin/attestd serve --db "$db" --listen "127.0.0.1:${port[$name]}" --admin-listen none --trust-anchor Fixtures/test-authority/root.pem \
    --upstream-url "http://127.0.0.1:$upstream_port" --upstream-key-file "$work/upstream.key" \
    --mint-limit 0 --challenge-limit 0 --registration-quota 0 $("$bin/attestd" serve --help 2>&1 | grep registration-limit-per-address >/dev/null && echo --registration-limit-per-address 0) $extra 2>>"$work/$name.log" &
  pid[$name]=$!
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:${port[$name]}/healthz" >/dev/null && break; sleep 0.05; done
  $bin/attest-sim simulate-device --base-url "http://127.0.0.1:${port[$name]}" --client-id "$clid" --state-dir "$work/device-$name" \
    --app-id ABCDE12345.com.example.app >/dev/null
  local token
  token=$(python3 -c 'import json,sys,glob; print(json.load(open(glob.glob(sys.argv[1]+"/client-*.json")[0]))["token"]["token"])' "$work/device-$name")
  cat > "$work/$name.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["content-type"] = "application/json"
wrk.headers["anthropic-version"] = "2023-06-01"
wrk.headers["authorization"] = "Bearer $token"
$extra
EOF
}
start baseline "$baseline" "$baseline_db"
start current "$current" "$current_db"

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A rps cpu_us
failed=0
printf '%-6s %-9s %10s %9s %10s\n' round build req/s p99_ms cpu_us/req
for round in $(seq 1 "$rounds"); do
  order=(baseline current); [ $((round % 2)) = 0 ] && order=(current baseline)
  for name in "${order[@]}"; do
    before=$(cpu "${pid[$name]}")
    out=$("${client_cpu[@]}" wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/$name.lua" "http://127.0.0.1:${port[$name]}/v1/messages" 2>&1)
    after=$(cpu "${pid[$name]}")
    read -r r p99 bad < <(python3 -c '
import re, sys
t = sys.stdin.read()
def ms(v):
    m = re.fullmatch(r"([\d.]+)([a-z]*)", v); return float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000, "": 1000}[m.group(2)]
r = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1)); p = ms(re.search(r"^\s*99%\s+(\S+)", t, re.M).group(1))
b = re.search(r"Non-2xx or 3xx responses: (\d+)", t); print(f"{r:.0f} {p:.2f} {b.group(1) if b else 0}")' <<<"$out")
    c=$(python3 -c 'import sys; t,tps,r,s=map(float,sys.argv[1:]); print(f"{t/tps*1e6/max(1,r*s):.1f}")' "$((after - before))" "$ticks" "$r" "$seconds")
    if [ "$bad" != 0 ]; then failed=1; echo "$round $name FAILED: $bad non-2xx answers"; continue; fi
    printf '%-6s %-9s %10s %9s %10s\n' "$round" "$name" "$r" "$p99" "$c"
    rps[$name]+="$r " cpu_us[$name]+="$c "
  done
done
[ $failed = 0 ] || { echo "relay-ab: FAILED runs, no figures"; exit 1; }
python3 - "${rps[baseline]}" "${rps[current]}" "${cpu_us[baseline]}" "${cpu_us[current]}" <<'EOF'
import statistics, sys
rb, rc, cb, cc = ([float(x) for x in a.split()] for a in sys.argv[1:])
print(f"median req/s: baseline {statistics.median(rb):.0f}, current {statistics.median(rc):.0f}")
print(f"median attestd CPU per request: baseline {statistics.median(cb):.1f} us, current {statistics.median(cc):.1f} us")
pairs = [c / b for b, c in zip(rb, rc)]
cpus = [c / b for b, c in zip(cb, cc)]
print("current/baseline req/s per round: " + ", ".join(f"{x:.3f}" for x in pairs) + f" (median {statistics.median(pairs):.3f})")
print("current/baseline CPU per request per round: " + ", ".join(f"{x:.3f}" for x in cpus) + f" (median {statistics.median(cpus):.3f})")
EOF
